"""Federated DP-ES across silos that cannot pool their records (docs/federated.md).

The coordinator runs the DP-ES generations (population, selection, mutation on public
inputs only); each silo scores the candidates on its own records with its own engine
and returns what its noise placement allows. Flower (``dp-textgrad[federated]``) carries
the messages; nothing here imports it until a Flower run starts.
"""

from dp_textgrad.federated.coordinator import SHRINKAGE, FederatedScoring, InProcessSilos
from dp_textgrad.federated.placement import (
    PLACEMENTS,
    Guarantee,
    guarantees,
    silo_mechanism,
    silo_noise_factor,
    total_noise_factor,
)
from dp_textgrad.federated.remote import RemoteRecords
from dp_textgrad.federated.silo import Silo, SiloRefused, SiloState
from dp_textgrad.federated.split import dirichlet_label_split, label_mix

__all__ = [
    "FederatedScoring",
    "Guarantee",
    "InProcessSilos",
    "PLACEMENTS",
    "RemoteRecords",
    "SHRINKAGE",
    "Silo",
    "SiloRefused",
    "SiloState",
    "dirichlet_label_split",
    "guarantees",
    "label_mix",
    "silo_mechanism",
    "silo_noise_factor",
    "total_noise_factor",
]
