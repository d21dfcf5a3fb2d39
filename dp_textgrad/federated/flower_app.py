"""The federation on Flower: silos as a ClientApp, the DP-ES coordinator as a ServerApp.

Requests and replies are the plain dicts of :mod:`dp_textgrad.federated.silo`, carried in
Flower ``Message`` objects (numbers and strings in a ``ConfigRecord``, arrays in an
``ArrayRecord``). A silo's state between two requests (its own account and the confusion
counts it holds for the feedback request) lives in the node's ``context.state``, which
Flower keeps on the silo's SuperNode. The ServerApp's ``main`` runs the whole DP-ES loop
with :class:`~dp_textgrad.federated.coordinator.FederatedScoring` over the grid. With
secure aggregation, a noised reply instead goes through the ClientApp's ``train`` handler,
wrapped in Flower's ``secaggplus_mod`` (:mod:`dp_textgrad.federated.secure_sum`).

:func:`run_flower_simulation` runs both with Flower's simulation engine (on Ray) on this
machine: one virtual SuperNode per silo. Needs ``pip install 'dp-textgrad[federated]'``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dp_textgrad.federated.silo import Silo, SiloRefused, SiloState

SiloBuilder = Callable[[int], Silo]
_ARRAYS = ("sums", "confusion")
_STATE_KEY = "dp_textgrad_silo"


def encode(payload: dict[str, Any]) -> Any:
    """A request or reply as a Flower RecordDict: arrays apart, everything else as JSON text."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    arrays = {
        k: Array(np.ascontiguousarray(np.asarray(v, dtype=float)))
        for k, v in payload.items()
        if k in _ARRAYS and v is not None
    }
    rest = {k: v for k, v in payload.items() if k not in arrays}
    record = RecordDict({"fields": ConfigRecord({"json": json.dumps(rest)})})
    if arrays:
        record["arrays"] = ArrayRecord(arrays)
    return record


def decode(content: Any) -> dict[str, Any]:
    payload = json.loads(content["fields"]["json"])
    if "arrays" in content:
        payload.update({k: v.numpy() for k, v in content["arrays"].items()})
    return payload


def _load_state(context: Any) -> SiloState:
    if _STATE_KEY not in context.state:
        return SiloState()
    saved = json.loads(context.state[_STATE_KEY]["json"])
    arrays = context.state[_STATE_KEY + "_arrays"] if _STATE_KEY + "_arrays" in context.state else {}
    confusion = arrays["confusion"].numpy() if "confusion" in arrays else None
    return SiloState(
        events=saved["events"],
        confusion=confusion,
        feedback_noise_multiplier=saved.get("feedback_noise_multiplier"),
        releases=saved.get("releases", []),
    )


def _save_state(context: Any, state: SiloState) -> None:
    from flwr.app import Array, ArrayRecord, ConfigRecord

    context.state[_STATE_KEY] = ConfigRecord(
        {
            "json": json.dumps(
                {
                    "events": state.events,
                    "releases": state.releases,
                    "feedback_noise_multiplier": state.feedback_noise_multiplier,
                }
            )
        }
    )
    held = {} if state.confusion is None else {"confusion": Array(np.ascontiguousarray(state.confusion))}
    context.state[_STATE_KEY + "_arrays"] = ArrayRecord(held)


def partition_id(context: Any) -> int:
    """A simulated SuperNode's silo: Flower's ``partition-id`` node setting."""
    return int(context.node_config["partition-id"])


def make_client_app(build_silo: SiloBuilder, locate: Callable[[Any], int] = partition_id) -> Any:
    """The silos' ClientApp: the SuperNode that ``locate`` maps to index i is silo i, built once per
    worker process (simulation: ``partition-id``; deployment: :mod:`dp_textgrad.federated.deploy`)."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import Message
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    app = ClientApp()
    built: dict[int, Silo] = {}

    @app.query()
    def answer(message: Any, context: Any) -> Any:
        index = locate(context)
        request = decode(message.content)
        if request.get("kind") == "who":  # the coordinator maps node ids to silos at start-up
            return Message(encode({"partition": index}), reply_to=message)
        state = _load_state(context)
        try:
            if index not in built:
                built[index] = build_silo(index)
            reply = built[index].handle(request, state)
        except SiloRefused as exc:  # the silo's own refusal: its text names settings, never records
            reply = {"failed": str(exc)}
        except Exception:  # noqa: BLE001 - an engine's error text may quote a record: it stays here
            reply = {"failed": "scoring failed at the silo (its error stays with the silo)"}
        _save_state(context, state)
        return Message(encode(reply), reply_to=message)

    @app.train(mods=[secaggplus_mod])
    def contribute(message: Any, context: Any) -> Any:
        """A secure-sum round (docs/federated.md): the silo's noised reply goes masked into SecAgg+."""
        index = locate(context)
        request = json.loads(str(compat.recorddict_to_fitins(message.content, keep_input=True).config["request"]))
        key = request.pop("sum_of")
        state = _load_state(context)
        try:
            if index not in built:
                built[index] = build_silo(index)
            reply = built[index].handle(request, state)
        except SiloRefused as exc:  # names settings only; the round then fails without this silo
            raise SiloRefused(str(exc)) from None
        except Exception:  # noqa: BLE001 - an engine's error text may quote a record: it stays here
            raise RuntimeError("scoring failed at the silo (its error stays with the silo)") from None
        finally:
            _save_state(context, state)
        values = np.ascontiguousarray(np.asarray(reply[key], dtype=float))
        result = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([values]), num_examples=1, metrics={})
        return Message(compat.fitres_to_recorddict(result, keep_input=False), reply_to=message)

    return app


class FlowerGrid:
    """A silo transport over a Flower ``Grid``: one query message per silo, replies in silo order."""

    def __init__(self, grid: Any, silos: int, timeout: float = 3600.0, wait: float = 120.0) -> None:
        self.grid, self.timeout = grid, timeout
        self.rounds = 0  # secure-sum rounds so far (Flower groups a round's messages by it)
        deadline = time.monotonic() + wait
        while len(list(grid.get_node_ids())) < silos:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"silos: only {len(list(grid.get_node_ids()))} of {silos} Flower nodes joined within {wait:g} s"
                )
            time.sleep(0.05)
        self.nodes = self._nodes_by_partition(silos)

    def _nodes_by_partition(self, silos: int) -> list[int]:
        from flwr.app import Message

        node_ids = sorted(self.grid.get_node_ids())
        probes = [Message(encode({"kind": "who"}), dst_node_id=n, message_type="query") for n in node_ids]
        order: dict[int, int] = {}
        for reply in self.grid.send_and_receive(probes, timeout=self.timeout):
            if reply.has_error():
                raise RuntimeError("silos: a Flower node failed to start")
            partition = int(decode(reply.content)["partition"])
            if partition in order:  # e.g. two SuperNodes started with the same silo name
                raise RuntimeError(f"silos: two Flower nodes serve silo {partition}; start one SuperNode per silo")
            order[partition] = int(reply.metadata.src_node_id)
        if sorted(order) != list(range(silos)):
            raise RuntimeError(f"silos: Flower nodes report partitions {sorted(order)}, expected 0..{silos - 1}")
        return [order[i] for i in range(silos)]

    def ask(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        from flwr.app import Message

        messages = [Message(encode(r), dst_node_id=n, message_type="query") for n, r in zip(self.nodes, requests)]
        replies = {int(m.metadata.src_node_id): m for m in self.grid.send_and_receive(messages, timeout=self.timeout)}
        out = []
        for node in self.nodes:
            reply = replies.get(node)
            # A silo's error text may quote its records: only the fact of the failure crosses.
            if reply is None or reply.has_error():
                raise RuntimeError("a silo failed to answer (its error stays with the silo)")
            answer = decode(reply.content)
            if "failed" in answer:
                raise SiloRefused(f"silo {self.nodes.index(node)}: {answer['failed']}")
            out.append(answer)
        return out

    def ask_sum(self, request: dict[str, Any], key: str, bound: float) -> np.ndarray:
        """The sum over silos of ``reply[key]`` by SecAgg+: no single silo's value reaches this process."""
        from dp_textgrad.federated.secure_sum import flower_secure_sum

        self.rounds += 1
        return flower_secure_sum(
            self.grid, self.nodes, {**request, "sum_of": key}, bound, self.rounds, timeout=self.timeout
        )


def run_flower_simulation(
    build_silo: SiloBuilder,
    silos: int,
    coordinate: Callable[[FlowerGrid], Any],
    *,
    cpus_per_silo: float = 1.0,
    num_cpus: int | None = None,
    verbose: bool = False,
) -> Any:
    """Run ``coordinate(grid)`` as the ServerApp against ``silos`` simulated SuperNodes; return its result."""
    import logging
    import os
    import warnings

    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    outcome: dict[str, Any] = {}
    server = ServerApp()

    @server.main()
    def main(grid: Any, context: Any) -> None:
        try:
            outcome["value"] = coordinate(FlowerGrid(grid, silos))
        except BaseException as exc:  # re-raised in the caller's thread below
            outcome["error"] = exc

    client = make_client_app(build_silo)
    cpus = num_cpus or os.cpu_count() or 1
    backend: dict[str, Any] = {
        "client_resources": {"num_cpus": min(float(cpus_per_silo), float(cpus))},
        "init_args": {
            "num_cpus": cpus,
            "include_dashboard": False,
            "log_to_driver": verbose,
            "logging_level": logging.INFO if verbose else logging.ERROR,
        },
    }
    flower_log = logging.getLogger("flwr")
    level = flower_log.level
    if not verbose:  # Flower's banners and per-message debug lines are noise on the user's console
        flower_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            # ray.init's FutureWarning about accelerator variables says nothing about this run.
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray\.")
            run_simulation(
                server_app=server,
                client_app=client,
                num_supernodes=silos,
                backend_config=backend,
                verbose_logging=verbose,
            )
    finally:
        flower_log.setLevel(level)
    if "error" in outcome:
        raise outcome["error"]
    if "value" not in outcome:
        raise RuntimeError("federated: the Flower simulation ended without running the coordinator")
    return outcome["value"]


__all__ = ["FlowerGrid", "decode", "encode", "make_client_app", "partition_id", "run_flower_simulation"]
