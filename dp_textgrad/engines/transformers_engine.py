"""Local models through Hugging Face ``transformers`` (GPU when there is one, else CPU).

This is the engine with full-vocabulary logits and gradients, so the audits use it
for Min-K%++ (vocabulary statistics at each position) and GradNorm (the gradient
of a text's loss with respect to the weights). It never downloads anything unless
the caller names a hub model, and it writes nothing to disk.

Tokenization rule (shared by every scoring method, so that they agree exactly):
a context or prefix is encoded with the tokenizer's special tokens (its BOS, where
it adds one), and every later piece (suffix, choice, scored text) is encoded on its
own without special tokens and appended. Piece boundaries are therefore token
boundaries, which is what lets the shared prefix be computed once; put the
separating space at the start of a piece (" positive"), not at the end of the one
before it.
"""

from __future__ import annotations

import copy
import inspect
import math
import os
import secrets
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dp_textgrad.engines.base import Engine, EngineError, TokenLogprobs

INSTALL_HINT = "pip install 'dp-textgrad[hf]'"
TOP_ALTERNATIVES = 5
# log_softmax over a 262k vocabulary in float32 is ~1 MB a position: bound the work
# done at once when many positions are needed (token_logprobs on a long text).
_POSITIONS_PER_CHUNK = 64
_DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
                "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def _import_hf() -> tuple[Any, Any]:
    """Import torch and transformers lazily: they are an optional extra."""
    try:
        import torch
        import transformers
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            f"TransformersEngine needs torch and transformers, which are not installed: {INSTALL_HINT}"
        ) from exc
    return torch, transformers


def _drop_dequantized_gguf_marker(model: Any) -> None:
    """transformers loads a GGUF by dequantizing it (unless the optional ``kernels``
    package keeps blocks packed) but leaves a quantizer attached that refuses
    ``save_pretrained`` and dtype changes. When every weight is a plain floating
    tensor, the marker is stale: remove it."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or "gguf" not in type(quantizer).__name__.lower():
        return
    import torch

    plain = all(type(p) in (torch.Tensor, torch.nn.Parameter) and p.is_floating_point()
                for p in model.parameters())
    packed = any("gguf" in type(m).__name__.lower() for m in model.modules())
    if plain and not packed:
        quantizer.remove_quantization_config(model)


def convert_gguf(gguf_path: str | os.PathLike[str], output_dir: str | os.PathLike[str], *,
                 overwrite: bool = False) -> Path:
    """Dequantize a GGUF checkpoint once into a transformers directory (float32).

    Loading a GGUF through transformers parses its metadata and dequantizes every
    tensor, which takes minutes on a small CPU; the converted directory loads in
    seconds. Returns ``output_dir`` at once when it already exists (unless
    ``overwrite``). Writes only there, atomically: into a temporary sibling, then a
    rename, so an interrupted conversion leaves nothing half-written. Needs the
    ``gguf`` and ``accelerate`` packages.
    """
    torch, transformers = _import_hf()
    source = Path(gguf_path)
    target = Path(output_dir)
    if not source.is_file():
        raise FileNotFoundError(f"gguf_path: no such file: {source}")
    if target.exists() and not overwrite:
        return target
    options = {"gguf_file": source.name, "local_files_only": True}
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.parent), **options)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source.parent), dtype=torch.float32, **options)
    _drop_dequantized_gguf_marker(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        if target.exists():
            shutil.rmtree(target)  # only reached with overwrite=True
        try:
            os.replace(scratch, target)
        except OSError:
            if not target.exists():
                raise  # otherwise another process finished the same conversion first
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class TransformersEngine(Engine):
    """A causal language model run in-process with Hugging Face ``transformers``.

    Load it from ``model_name_or_path`` (a local directory, a ``.gguf`` file, or a hub
    name, the only case that may download) or pass an already built ``model`` and
    ``tokenizer``.

    - ``device``: ``None`` picks CUDA when available, else CPU (a passed ``model``
      stays where it is); ``dtype``: ``None`` keeps float32 on CPU and uses bfloat16
      (float16 where unsupported) on CUDA; a name such as ``"float32"`` or a torch dtype.
    - ``max_batch_size``: sequences per forward pass in ``score_choices_batch``.
    - ``use_chat_template``: render ``generate`` prompts through the tokenizer's chat
      template (instruction-tuned models); otherwise the system prompt is prepended
      as plain text (base models).
    - ``cache``: opt-in in-memory cache of deterministic results (greedy generation,
      scores, log-probs, gradient norms) keyed on every input that changes them;
      sampled generations are never cached. Nothing is ever written to disk.
    - ``reuse_prefix``: compute the shared prefix of ``score_choices_batch`` once and
      expand its key/value cache across the batch (falls back to full sequences for
      models whose cache cannot be expanded).
    """

    def __init__(
        self,
        model_name_or_path: str | os.PathLike[str] | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        device: str | Any | None = None,
        dtype: str | Any | None = None,
        max_batch_size: int = 16,
        use_chat_template: bool = False,
        gguf_file: str | None = None,
        cache: bool = False,
        cache_max_entries: int = 4096,
        reuse_prefix: bool = True,
        system_prompt: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        torch, transformers = _import_hf()
        self._torch = torch
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be an integer >= 1, got {max_batch_size!r}")
        if isinstance(cache_max_entries, bool) or not isinstance(cache_max_entries, int) or cache_max_entries < 1:
            raise ValueError(f"cache_max_entries: must be an integer >= 1, got {cache_max_entries!r}")
        if model is not None and model_name_or_path is not None:
            raise ValueError("model_name_or_path: give either a name/path or model= and tokenizer=, not both")
        if model is None and model_name_or_path is None:
            raise ValueError(
                "model_name_or_path: give a local model directory, a .gguf file or a hub name "
                "(or pass model= and tokenizer=)"
            )

        torch_device = self._resolve_device(device, model)
        # A passed model keeps its dtype unless one is asked for.
        torch_dtype = None if (model is not None and dtype is None) else self._resolve_dtype(dtype, torch_device)
        if model is None:
            model, tokenizer, name = self._load(
                transformers, os.fspath(model_name_or_path), gguf_file, torch_dtype, trust_remote_code
            )
        else:
            if tokenizer is None:
                raise ValueError("tokenizer: required when model= is given")
            name = str(getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__)
        if torch_dtype is not None and getattr(model, "dtype", None) != torch_dtype:
            model = model.to(dtype=torch_dtype)
        self.model = model.to(torch_device)
        self.model.eval()  # no dropout: scores and GradNorm must be deterministic
        self.tokenizer = tokenizer
        self.device = torch_device
        self.max_batch_size = max_batch_size
        self.model_string = f"transformers:{name}"
        if system_prompt is not None:
            self.system_prompt = system_prompt
        if use_chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "use_chat_template: this tokenizer has no chat template; pass use_chat_template=False "
                "to prepend the system prompt as plain text"
            )
        self.use_chat_template = use_chat_template
        self.reuse_prefix = reuse_prefix
        self._lock = threading.RLock()
        self._cache: OrderedDict[Hashable, Any] | None = OrderedDict() if cache else None
        self._cache_max_entries = cache_max_entries
        self.cache_hits = 0
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._eos_ids = self._collect_eos_ids()
        self._pad_id = self._first_id("pad_token_id", "eos_token_id", "bos_token_id") or 0

    # -- construction helpers ---------------------------------------------------------
    def _resolve_device(self, device: Any, model: Any) -> Any:
        torch = self._torch
        if device is not None:
            return torch.device(device)
        if model is not None:
            try:
                return next(model.parameters()).device
            except StopIteration:
                return torch.device("cpu")
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def _resolve_dtype(self, dtype: Any, device: Any) -> Any:
        torch = self._torch
        if dtype is None:
            if device.type == "cuda":
                return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            return None  # keep what the checkpoint or the passed model has (float32 on CPU)
        if isinstance(dtype, str):
            canonical = _DTYPE_NAMES.get(dtype.lower())
            if canonical is None:
                raise ValueError(f"dtype: unknown name {dtype!r}; use one of float32, bfloat16, float16")
            return getattr(torch, canonical)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype: must be a floating torch dtype or its name, got {dtype!r}")
        return dtype

    @staticmethod
    def _load(transformers: Any, name: str, gguf_file: str | None, torch_dtype: Any,
              trust_remote_code: bool) -> tuple[Any, Any, str]:
        source = name
        if gguf_file is None and name.endswith(".gguf") and os.path.isfile(name):
            source, gguf_file = os.path.dirname(os.path.abspath(name)), os.path.basename(name)
        local = os.path.exists(source)
        # A local path never reaches the hub; only a hub name the caller chose may download.
        options: dict[str, Any] = {"local_files_only": local, "trust_remote_code": trust_remote_code}
        if gguf_file is not None:
            options["gguf_file"] = gguf_file
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, **options)
        model_options = dict(options)
        if torch_dtype is not None:
            model_options["dtype"] = torch_dtype
        model = transformers.AutoModelForCausalLM.from_pretrained(source, **model_options)
        if gguf_file is not None:
            _drop_dequantized_gguf_marker(model)
        label = os.path.basename(name.rstrip("/\\")) if local else name
        return model, tokenizer, label

    def _first_id(self, *attributes: str) -> int | None:
        for attribute in attributes:
            value = getattr(self.tokenizer, attribute, None)
            if value is not None:
                return int(value)
        return None

    def _collect_eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        config = getattr(self.model, "generation_config", None)
        for source in (getattr(config, "eos_token_id", None), getattr(self.tokenizer, "eos_token_id", None)):
            if source is None:
                continue
            ids.update(int(v) for v in (source if isinstance(source, (list, tuple, set)) else [source]))
        return frozenset(ids)

    # -- cache ------------------------------------------------------------------------
    def _cache_get(self, key: Hashable | None) -> Any:
        if self._cache is None or key is None:
            return None
        with self._lock:
            value = self._cache.get(key)
            if value is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
            return value

    def _cache_put(self, key: Hashable | None, value: Any) -> None:
        if self._cache is None or key is None:
            return
        with self._lock:
            self._cache[key] = value
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_max_entries:
                self._cache.popitem(last=False)

    def clear_cache(self) -> None:
        """Forget every cached result (the cache holds private text in memory)."""
        with self._lock:
            if self._cache is not None:
                self._cache.clear()

    # -- tokenization -----------------------------------------------------------------
    @property
    def context_tokens(self) -> int | None:
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(limit) if isinstance(limit, int) and limit > 0 else None

    def count_tokens(self, text: str) -> int:
        return len(self._encode_piece(text))

    def truncate_to_tokens(self, text: str, max_tokens: int) -> str:
        ids = self._encode_piece(text)
        if len(ids) <= max_tokens:
            return text
        cut = self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        while cut and len(self._encode_piece(cut)) > max_tokens:
            cut = cut[:-1]
        return cut

    def _encode_piece(self, text: str) -> list[int]:
        if not text:
            return []
        return [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def _encode_context(self, text: str) -> list[int]:
        ids = [int(t) for t in self.tokenizer(text, add_special_tokens=True)["input_ids"]]
        if not ids:
            # The first scored token needs something to condition on.
            start = self._first_id("bos_token_id", "eos_token_id")
            if start is None:
                raise ValueError(
                    "context: is empty and the tokenizer has no BOS or EOS token to start from; "
                    "give a non-empty context"
                )
            ids = [start]
        return ids

    def _prompt_ids(self, prompt: str, system_prompt: str | None) -> list[int]:
        system = self.system_prompt if system_prompt is None else system_prompt
        if not self.use_chat_template:
            return self._encode_context(f"{system}\n\n{prompt}" if system else prompt)
        user = {"role": "user", "content": prompt}
        messages = ([{"role": "system", "content": system}] if system else []) + [user]
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # some templates refuse a system role: fold it into the user turn
            if not system:
                raise
            merged = [{"role": "user", "content": f"{system}\n\n{prompt}"}]
            text = self.tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)
        return self._encode_piece(text)  # the template writes its own special tokens

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # -- model calls ------------------------------------------------------------------
    def _forward(self, input_ids: Any, keep: Sequence[int] | int, **kwargs: Any) -> Any:
        """Logits at the kept positions only: full-vocabulary logits at every position
        of a batch would not fit in memory for large vocabularies."""
        torch = self._torch
        if self._keeps_logits:
            wanted = keep if isinstance(keep, int) else torch.tensor(list(keep), device=self.device)
            out = self.model(input_ids=input_ids, logits_to_keep=wanted, **kwargs)
            return out
        out = self.model(input_ids=input_ids, **kwargs)
        if isinstance(keep, int):
            out.logits = out.logits[:, -keep:]
        else:
            out.logits = out.logits[:, list(keep)]
        return out

    def _tensor(self, rows: Sequence[Sequence[int]]) -> Any:
        return self._torch.tensor(rows, dtype=self._torch.long, device=self.device)

    # -- generation -------------------------------------------------------------------
    def _generate(
        self,
        prompt: str,
        *,
        system_prompt: str | None,
        temperature: float,
        max_tokens: int,
        seed: int | None,
        stop: list[str] | None,
    ) -> str:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {max_tokens!r}")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature: must be a finite number >= 0, got {temperature!r}")
        stops = tuple(s for s in (stop or ()) if s)
        resolved_system = self.system_prompt if system_prompt is None else system_prompt
        # Sampling is never cached: a repeated call must draw again.
        key = ("generate", prompt, resolved_system, max_tokens, stops) if temperature == 0 else None
        cached = self._cache_get(key)
        if cached is not None:
            return cached
        with self._timed() as timer, self._lock, self._torch.no_grad():
            ids = self._prompt_ids(prompt, system_prompt)
            text, steps = self._decode(ids, float(temperature), max_tokens, seed, stops)
        self._count(prompt_tokens=len(ids), completion_tokens=steps, seconds=timer["seconds"])
        self._cache_put(key, text)
        return text

    def _decode(self, ids: list[int], temperature: float, max_tokens: int, seed: int | None,
                stops: tuple[str, ...]) -> tuple[str, int]:
        """Token-by-token decoding with the key/value cache. Sampling draws from a CPU
        ``torch.Generator`` so a seed gives the same text on any device."""
        torch = self._torch
        generator = None
        if temperature > 0:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(seed if seed is not None else secrets.randbits(63))
        out = self._forward(self._tensor([ids]), 1, use_cache=True)
        generated: list[int] = []
        steps = 0
        while steps < max_tokens:
            logits = out.logits[0, -1].float()
            if not bool(torch.isfinite(logits).any()):
                raise EngineError("the model produced non-finite logits")
            token = self._pick(logits, temperature, generator)
            steps += 1
            if token in self._eos_ids:
                break
            generated.append(token)
            if stops:  # a stop string can span tokens, so look at the decoded text
                text = self.tokenizer.decode(generated, skip_special_tokens=True)
                cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
                if cut >= 0:
                    return text[:cut], steps
            if steps < max_tokens:
                out = self._forward(self._tensor([[token]]), 1, past_key_values=out.past_key_values,
                                    use_cache=True)
        return self.tokenizer.decode(generated, skip_special_tokens=True), steps

    def _pick(self, logits: Any, temperature: float, generator: Any) -> int:
        torch = self._torch
        if temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / temperature, dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=generator))

    # -- scoring ----------------------------------------------------------------------
    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        """log p(choice | prefix + suffix) for every suffix and choice, shape
        (len(suffixes), len(choices)); multi-token choices are summed over their tokens."""
        if isinstance(suffixes, str):
            raise TypeError("suffixes: pass a sequence of strings, not one string")
        if isinstance(choices, str):
            raise TypeError("choices: pass a sequence of strings, not one string")
        suffixes, choices = tuple(suffixes), tuple(choices)
        if not choices:
            raise ValueError("choices: need at least one choice")
        if not suffixes:
            return np.zeros((0, len(choices)))
        key = ("score", prefix, suffixes, choices)
        cached = self._cache_get(key)
        if cached is not None:
            return cached.copy()
        with self._timed() as timer, self._lock, self._torch.no_grad():
            scores, tokens = self._score(prefix, suffixes, choices)
        self._count(prompt_tokens=tokens, seconds=timer["seconds"])
        self._cache_put(key, scores.copy())
        return scores

    def _score(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> tuple[np.ndarray, int]:
        prefix_ids = self._encode_context(prefix)
        suffix_ids = [self._encode_piece(s) for s in suffixes]
        choice_ids = [self._encode_piece(c) for c in choices]
        for j, ids in enumerate(choice_ids):
            if not ids:
                raise ValueError(f"choices[{j}]: encodes to no tokens; a choice must be non-empty text")
        # A row is what follows the prefix: suffix + all but the last token of a choice.
        # Single-token choices share one row per suffix; the logits at position p predict
        # token p + 1, with p = -1 the prefix's last position.
        row_index: dict[tuple[int, ...], int] = {}
        needed: list[dict[int, set[int]]] = []
        plan: list[tuple[int, int, int, list[tuple[int, int]]]] = []
        for i, s_ids in enumerate(suffix_ids):
            for j, c_ids in enumerate(choice_ids):
                row = row_index.setdefault(tuple(s_ids + c_ids[:-1]), len(row_index))
                if row == len(needed):
                    needed.append({})
                steps = [(len(s_ids) + k - 1, token) for k, token in enumerate(c_ids)]
                for position, token in steps:
                    needed[row].setdefault(position, set()).add(token)
                plan.append((i, j, row, steps))
        rows = [list(r) for r in row_index]  # dicts keep insertion order, so indices match
        logprobs, tokens = self._row_logprobs(prefix_ids, rows, needed)
        scores = np.empty((len(suffixes), len(choices)), dtype=np.float64)
        for i, j, row, steps in plan:
            scores[i, j] = sum(logprobs[(row, position, token)] for position, token in steps)
        return scores, tokens

    def _row_logprobs(self, prefix_ids: list[int], rows: list[list[int]],
                      needed: list[dict[int, set[int]]]) -> tuple[dict[tuple[int, int, int], float], int]:
        if self.reuse_prefix:
            result = self._row_logprobs_shared_prefix(prefix_ids, rows, needed)
            if result is not None:
                return result
        return self._row_logprobs_full(prefix_ids, rows, needed)

    def _gather(self, logits: Any, targets: set[int], key: tuple[int, int],
                into: dict[tuple[int, int, int], float]) -> None:
        """log_softmax in float32 of one position, read at the target tokens."""
        row = logits.float()
        lse = self._torch.logsumexp(row, dim=-1)
        ordered = sorted(targets)
        picked = (row[ordered] - lse).tolist()
        for token, value in zip(ordered, picked):
            into[(key[0], key[1], token)] = float(value)

    def _row_logprobs_shared_prefix(self, prefix_ids: list[int], rows: list[list[int]],
                                    needed: list[dict[int, set[int]]]
                                    ) -> tuple[dict[tuple[int, int, int], float], int] | None:
        """Run the prefix once, then each batch of rows on a copy of its cache."""
        torch = self._torch
        prefix_out = self._forward(self._tensor([prefix_ids]), 1, use_cache=True)
        prefix_cache = getattr(prefix_out, "past_key_values", None)
        if prefix_cache is None or not hasattr(prefix_cache, "batch_repeat_interleave"):
            return None  # this model's cache cannot be shared across a batch
        into: dict[tuple[int, int, int], float] = {}
        for row, wanted in enumerate(needed):
            if -1 in wanted:
                self._gather(prefix_out.logits[0, -1], wanted[-1], (row, -1), into)
        n_prefix = len(prefix_ids)
        tokens = n_prefix
        # Longest first, so rows of similar length share a batch (less padding).
        order = sorted((r for r in range(len(rows)) if rows[r]), key=lambda r: -len(rows[r]))
        for batch in _chunks(order, self.max_batch_size):
            width = len(rows[batch[0]])
            input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long, device=self.device)
            mask = torch.zeros((len(batch), n_prefix + width), dtype=torch.long, device=self.device)
            mask[:, :n_prefix] = 1
            for b, r in enumerate(batch):
                input_ids[b, : len(rows[r])] = torch.tensor(rows[r], dtype=torch.long)
                mask[b, n_prefix : n_prefix + len(rows[r])] = 1  # right padding: real tokens first
                tokens += len(rows[r])
            keep = sorted({p for r in batch for p in needed[r] if p >= 0})
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(batch))
            out = self._forward(input_ids, keep, attention_mask=mask, past_key_values=cache, use_cache=True)
            column = {p: c for c, p in enumerate(keep)}
            for b, r in enumerate(batch):
                for position, targets in needed[r].items():
                    if position >= 0:
                        self._gather(out.logits[b, column[position]], targets, (r, position), into)
        return into, tokens

    def _row_logprobs_full(self, prefix_ids: list[int], rows: list[list[int]],
                           needed: list[dict[int, set[int]]]) -> tuple[dict[tuple[int, int, int], float], int]:
        """Whole sequences (prefix + row), right-padded, for models without a shareable cache."""
        torch = self._torch
        into: dict[tuple[int, int, int], float] = {}
        n_prefix = len(prefix_ids)
        tokens = 0
        order = sorted(range(len(rows)), key=lambda r: -len(rows[r]))
        for batch in _chunks(order, self.max_batch_size):
            width = n_prefix + len(rows[batch[0]])
            input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long, device=self.device)
            mask = torch.zeros((len(batch), width), dtype=torch.long, device=self.device)
            for b, r in enumerate(batch):
                sequence = prefix_ids + rows[r]
                input_ids[b, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
                mask[b, : len(sequence)] = 1
                tokens += len(sequence)
            keep = sorted({n_prefix + p for r in batch for p in needed[r]})
            out = self._forward(input_ids, keep, attention_mask=mask, use_cache=False)
            column = {p: c for c, p in enumerate(keep)}
            for b, r in enumerate(batch):
                for position, targets in needed[r].items():
                    self._gather(out.logits[b, column[n_prefix + position]], targets, (r, position), into)
        return into, tokens

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        """Per-token log p of ``text`` after ``context``, the top-5 alternatives, and at each
        position the mean and standard deviation of log p(z) for z drawn from the model's
        next-token distribution over the full vocabulary (Min-K%++'s mu and sigma)."""
        key = ("tokens", text, context)
        cached = self._cache_get(key)
        if cached is not None:
            return cached
        with self._timed() as timer, self._lock, self._torch.no_grad():
            context_ids = self._encode_context(context)
            text_ids = self._encode_piece(text)
            result = self._token_logprobs(context_ids, text_ids)
        self._count(prompt_tokens=len(context_ids) + len(text_ids), seconds=timer["seconds"])
        self._cache_put(key, result)
        return result

    def _token_logprobs(self, context_ids: list[int], text_ids: list[int]) -> TokenLogprobs:
        torch = self._torch
        n = len(text_ids)
        if n == 0:
            empty = np.zeros(0)
            return TokenLogprobs([], empty, [], empty.copy(), empty.copy())
        # The last n + 1 positions hold the logits predicting the n text tokens (the last
        # position predicts past the end and is dropped).
        out = self._forward(self._tensor([context_ids + text_ids]), n + 1, use_cache=False)
        logits = out.logits[0, :n]
        targets = torch.tensor(text_ids, dtype=torch.long, device=logits.device)
        logprobs, means, stds, alternatives = [], [], [], []
        for start in range(0, n, _POSITIONS_PER_CHUNK):
            part = torch.log_softmax(logits[start : start + _POSITIONS_PER_CHUNK].float(), dim=-1)
            probs = part.exp()
            mean = (probs * part).sum(-1)
            var = (probs * (part - mean[:, None]) ** 2).sum(-1).clamp_min(0.0)
            logprobs.extend(part.gather(1, targets[start : start + len(part), None])[:, 0].tolist())
            means.extend(mean.tolist())
            stds.extend(var.sqrt().tolist())
            top = torch.topk(part, k=min(TOP_ALTERNATIVES, part.shape[-1]), dim=-1)
            for values, ids in zip(top.values.tolist(), top.indices.tolist()):
                alternatives.append([(self._token_text(t), float(v)) for t, v in zip(ids, values)])
        return TokenLogprobs(
            tokens=[self._token_text(t) for t in text_ids],
            logprobs=np.array(logprobs, dtype=np.float64),
            top_alternatives=alternatives,
            vocab_mean=np.array(means, dtype=np.float64),
            vocab_std=np.array(stds, dtype=np.float64),
        )

    # -- gradients --------------------------------------------------------------------
    def grad_norm(self, text: str, context: str = "") -> float:
        """L2 norm of the gradient of the mean NLL of ``text`` (given ``context``) with
        respect to all floating-point model parameters (GradNorm membership score).

        The model is in eval mode (no dropout), so the value is deterministic; the
        parameters' ``.grad`` and ``requires_grad`` are restored afterwards.
        """
        key = ("grad_norm", text, context)
        cached = self._cache_get(key)
        if cached is not None:
            return cached
        torch = self._torch
        with self._timed() as timer, self._lock:
            context_ids = self._encode_context(context)
            text_ids = self._encode_piece(text)
            if not text_ids:
                raise ValueError("text: encodes to no tokens; GradNorm needs at least one token")
            value = self._grad_norm(torch, context_ids, text_ids)
        self._count(prompt_tokens=len(context_ids) + len(text_ids), seconds=timer["seconds"])
        if not math.isfinite(value):
            raise EngineError("the gradient norm is not finite (overflow in this dtype?)")
        self._cache_put(key, value)
        return value

    def _grad_norm(self, torch: Any, context_ids: list[int], text_ids: list[int]) -> float:
        model = self.model
        params = [p for p in model.parameters() if p.is_floating_point()]
        saved = [(p.requires_grad, p.grad) for p in params]
        was_training = model.training
        try:
            model.eval()
            for p in params:
                p.requires_grad_(True)
                p.grad = None
            with torch.enable_grad():
                n = len(text_ids)
                out = self._forward(self._tensor([context_ids + text_ids]), n + 1, use_cache=False)
                logits = out.logits[0, :n].float()
                targets = torch.tensor(text_ids, dtype=torch.long, device=logits.device)
                loss = torch.nn.functional.cross_entropy(logits, targets)  # mean NLL per token
                loss.backward()
            norms = [p.grad.detach().float().norm() for p in params if p.grad is not None]
            if not norms:
                raise EngineError("the model has no trainable floating-point parameters")
            return float(torch.linalg.vector_norm(torch.stack(norms)))
        finally:
            for p, (requires_grad, grad) in zip(params, saved):
                p.grad = grad
                p.requires_grad_(requires_grad)
            model.train(was_training)
