"""Tasks by name: ``get_task("support")``, ``get_task("support_extract")``, ``get_task("sst2")``, ...

``support`` (classification) and ``support_extract`` (generation) are built in (no
download). ``sst2``, ``banking77`` and the generation tasks ``snips`` and ``gsm8k`` read
the benchmark data directory (``data_dir=...``, else ``$DP_TEXTGRAD_DATA``, else ``../shared/data``),
which is never copied into the package.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from dp_textgrad.tasks.base import ClassificationTask, Example, ScoreKind, Task
from dp_textgrad.tasks.benchmark_generation import build_gsm8k, build_snips
from dp_textgrad.tasks.loaders import build_task_from_files, load_classification_file, resolve_data_dir, subsample
from dp_textgrad.tasks.support_extract import make_support_extract_task
from dp_textgrad.tasks.synthetic import make_support_task

# ----------------------------------------------------------------------------------
# SST-2
SST2_LABEL_NAMES = MappingProxyType({"0": "negative", "1": "positive"})
SST2_DESCRIPTION = (
    "Short phrases and sentences from English film reviews (GLUE SST-2). "
    "The task is to say whether the text expresses a negative or a positive opinion of the film."
)
# Written for this project (not from SST-2): generic review sentences for demos and public scoring.
SST2_PUBLIC_EXAMPLES = (
    Example("a warm , funny and beautifully acted film that stays with you", "positive"),
    Example("the plot drags and the jokes fall flat", "negative"),
    Example("one of the most charming surprises of the year", "positive"),
    Example("a tedious mess that wastes a talented cast", "negative"),
    Example("sharp writing and a lovely score make it worth the ticket", "positive"),
    Example("i kept checking my watch", "negative"),
    Example("never quite as clever as it thinks it is", "negative"),
    Example("an honest , moving portrait of a family", "positive"),
    Example("not bad at all , in fact rather good", "positive"),
    Example("the effects are fine but the story is hollow", "negative"),
)


def build_sst2(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    n_private: int | None = 2000,
    n_test: int | None = None,
    seed: int = 0,
    score_kind: ScoreKind = "accuracy",
    public_inputs: int = 0,
) -> ClassificationTask:
    """SST-2: ``train.tsv`` is the private pool (``n_private`` records drawn by ``seed``), ``dev.tsv`` the test set.

    ``public_inputs``: how many public unlabelled inputs to add (default none), for a labelling
    phase (``dp.labelling``): texts of ``train.tsv`` records outside the private draw (which
    depends on the seed and the file's size only), drawn by a stream of ``seed`` of their own,
    labels dropped. A benchmark's split of one public corpus into a simulated private part and a
    public part, fixed before any private computation (the pool never depends on a record's content).
    """
    _check_pool_size(public_inputs)
    root = resolve_data_dir(data_dir) / "sst2"
    task = _sst2_task(root, n_private, n_test, seed, score_kind)
    if not public_inputs:
        return task
    train = load_classification_file(root / "train.tsv", warn_imbalance=False)
    positions: Any = range(len(train))  # subsample draws positions (seed and size only): the same draw
    taken: set[Any] = set(subsample(positions, n_private, seed))
    rest = [i for i in range(len(train)) if i not in taken]
    return _with_pool(task, [train[i].text for i in rest], public_inputs, seed)


def _check_pool_size(public_inputs: int) -> None:
    if isinstance(public_inputs, bool) or not isinstance(public_inputs, int) or public_inputs < 0:
        raise ValueError(f"public_inputs: must be an integer >= 0, got {public_inputs!r}")


def _with_pool(task: ClassificationTask, candidates: list[str], count: int, seed: int) -> ClassificationTask:
    """``task`` with ``count`` public inputs drawn from ``candidates`` (a stream of ``seed`` apart from
    the private and test draws), in the drawn order (a labelling phase labels the first ones)."""
    import dataclasses

    import numpy as np

    if count > len(candidates):
        raise ValueError(f"public_inputs: asked for {count}, only {len(candidates)} public inputs are available")
    order = np.random.default_rng([int(seed), 0x9B1]).choice(len(candidates), size=count, replace=False)
    return dataclasses.replace(task, public_inputs=[candidates[int(i)] for i in order])


def _sst2_task(
    root: Any, n_private: int | None, n_test: int | None, seed: int, score_kind: ScoreKind
) -> ClassificationTask:
    return build_task_from_files(
        "sst2",
        root / "train.tsv",
        root / "dev.tsv",
        public=list(SST2_PUBLIC_EXAMPLES),
        labels=["negative", "positive"],
        label_names=SST2_LABEL_NAMES,
        description=SST2_DESCRIPTION,
        record_template="Review: {text}\nSentiment:",
        score_kind=score_kind,
        seed_prompt="Read the review.",
        n_private=n_private,
        n_test=n_test,
        seed=seed,
    )


# ----------------------------------------------------------------------------------
# BANKING77, restricted to its 10 most frequent intents in train.tsv (counted once, before
# any experiment; scoring 77 labels per record is too slow on a CPU). Counts in train.tsv:
# 168, 164, 163, 162, 159, 157, 156, 155, 154, 154; the 11th intent has 152, so no tie.
BANKING77_INTENTS = MappingProxyType(
    {
        # raw intent label -> readable verbaliser (what the model is asked to continue with)
        "card_payment_fee_charged": " card payment fee",
        "direct_debit_payment_not_recognised": " unknown direct debit",
        "balance_not_updated_after_cheque_or_cash_deposit": " deposit not showing",
        "wrong_amount_of_cash_received": " wrong cash amount",
        "cash_withdrawal_charge": " cash withdrawal fee",
        "transaction_charged_twice": " charged twice",
        "declined_cash_withdrawal": " withdrawal declined",
        "transfer_fee_charged": " transfer fee",
        "transfer_not_received_by_recipient": " transfer not received",
        "balance_not_updated_after_bank_transfer": " transfer not in balance",
    }
)
BANKING77_DESCRIPTION = (
    "Questions from customers of an online bank (BANKING77, restricted to 10 intents). "
    "The task is to name the intent: a fee on a card payment, a direct debit the customer does not "
    "recognise, a cash or cheque deposit not yet in the balance, an ATM giving the wrong amount of cash, "
    "a fee for a cash withdrawal, a payment charged twice, a declined cash withdrawal, a fee on a transfer, "
    "a transfer the recipient has not received, or a transfer not yet reflected in the balance."
)
# Written for this project (not from BANKING77): one or two questions per intent.
BANKING77_PUBLIC_EXAMPLES = (
    Example("Why did I pay an extra fee when I bought something with my card?", "card_payment_fee_charged"),
    Example(
        "There is a direct debit on my account from a company I have never heard of.",
        "direct_debit_payment_not_recognised",
    ),
    Example(
        "I paid in a cheque two days ago and my balance still looks the same.",
        "balance_not_updated_after_cheque_or_cash_deposit",
    ),
    Example("The cash machine gave me less money than I asked for.", "wrong_amount_of_cash_received"),
    Example("Why was I charged for taking money out of an ATM?", "cash_withdrawal_charge"),
    Example("The same purchase shows up two times in my transactions.", "transaction_charged_twice"),
    Example("The ATM refused to give me cash, what is wrong with my card?", "declined_cash_withdrawal"),
    Example("How much does it cost to send money to another account? I was charged for it.", "transfer_fee_charged"),
    Example("I sent money to my friend but she says it never arrived.", "transfer_not_received_by_recipient"),
    Example(
        "I moved money into my account from my other bank and the balance has not changed.",
        "balance_not_updated_after_bank_transfer",
    ),
    Example("Is there a charge for using my card in a shop abroad? I see a fee.", "card_payment_fee_charged"),
    Example("My card was declined at the cash machine this morning.", "declined_cash_withdrawal"),
)


def build_banking77(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    split: str = "test",
    n_private: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    score_kind: ScoreKind = "accuracy",
    public_inputs: int = 0,
) -> ClassificationTask:
    """BANKING77 on 10 intents: ``train.tsv`` is the private pool, ``split`` ("test" or "dev") the test set.

    ``public_inputs``: how many public unlabelled inputs to add (default none), for a labelling
    phase (``dp.labelling``): questions of the 10 intents from the other split (``dev`` when the
    test set is ``test``, and the other way round), drawn by a stream of ``seed`` of their own,
    labels dropped; disjoint from the private and the test records by construction.
    """
    if split not in ("test", "dev"):
        raise ValueError(f"split: use 'test' or 'dev', got {split!r}")
    _check_pool_size(public_inputs)
    root = resolve_data_dir(data_dir) / "banking77"
    task = _banking77_task(root, split, n_private, n_test, seed, score_kind)
    if not public_inputs:
        return task
    other = load_classification_file(root / f"{'dev' if split == 'test' else 'test'}.tsv", warn_imbalance=False)
    return _with_pool(task, [ex.text for ex in other if ex.label in BANKING77_INTENTS], public_inputs, seed)


def _banking77_task(
    root: Any, split: str, n_private: int | None, n_test: int | None, seed: int, score_kind: ScoreKind
) -> ClassificationTask:
    return build_task_from_files(
        "banking77",
        root / "train.tsv",
        root / f"{split}.tsv",
        public=list(BANKING77_PUBLIC_EXAMPLES),
        labels=list(BANKING77_INTENTS),
        drop_other_labels=True,
        verbalizers=dict(BANKING77_INTENTS),
        description=BANKING77_DESCRIPTION,
        record_template="Question: {text}\nIntent:",
        score_kind=score_kind,
        seed_prompt="Read the question.",
        n_private=n_private,
        n_test=n_test,
        seed=seed,
    )


# ----------------------------------------------------------------------------------
_BUILDERS: Mapping[str, Callable[..., Task]] = MappingProxyType(
    {
        "support": make_support_task,
        "support_extract": make_support_extract_task,  # generation: the account number of a message
        "sst2": build_sst2,
        "banking77": build_banking77,
        "snips": build_snips,  # generation: slot extraction (tasks/benchmark_generation.py)
        "gsm8k": build_gsm8k,  # generation: numeric final answer
    }
)


def generation_token_cap(name: str, options: Mapping[str, Any] | None = None) -> int | None:
    """The ``max_new_tokens`` the built-in task ``name`` will have with ``options`` (its builder's
    default unless given), found without building it; None for a classification task."""
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"task: unknown task {name!r}; available tasks are {available_tasks()}") from None
    parameter = inspect.signature(builder).parameters.get("max_new_tokens")
    if parameter is None:
        return None
    value = (options or {}).get("max_new_tokens", parameter.default)
    return int(value)


def available_tasks() -> list[str]:
    """Names accepted by :func:`get_task`."""
    return sorted(_BUILDERS)


def get_task(name: str, **kwargs: Any) -> Task:
    """Build the task called ``name``; ``kwargs`` go to its builder (e.g. ``seed``, ``data_dir``)."""
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"task: unknown task {name!r}; available tasks are {available_tasks()}") from None
    return builder(**kwargs)
