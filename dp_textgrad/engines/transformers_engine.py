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

import inspect
import math
import os
import secrets
import threading
from collections.abc import Sequence
from typing import Any

from dp_textgrad.engines.base import CachesResults, Engine, EngineError, ResultCache
from dp_textgrad.engines.transformers_loading import (
    INSTALL_HINT,
    convert_gguf,
    drop_dequantized_gguf_marker,
    import_hf,
)
from dp_textgrad.engines.transformers_scoring import TOP_ALTERNATIVES, HfScoring

_DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


class TransformersEngine(HfScoring, CachesResults, Engine):
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
        torch, transformers = import_hf()
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
        if model_name_or_path is not None:  # else model= was given (exactly one of the two is)
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
        self._results = ResultCache(cache_max_entries) if cache else None
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
    def _load(
        transformers: Any, name: str, gguf_file: str | None, torch_dtype: Any, trust_remote_code: bool
    ) -> tuple[Any, Any, str]:
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
            drop_dequantized_gguf_marker(model)
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
        hit, cached = self._cache_get(key)
        if hit:
            return cached
        with self._timed() as timer, self._lock, self._torch.no_grad():
            ids = self._prompt_ids(prompt, system_prompt)
            text, steps = self._decode(ids, float(temperature), max_tokens, seed, stops)
        self._count(prompt_tokens=len(ids), completion_tokens=steps, seconds=timer["seconds"])
        self._cache_put(key, text)
        return text

    def _decode(
        self, ids: list[int], temperature: float, max_tokens: int, seed: int | None, stops: tuple[str, ...]
    ) -> tuple[str, int]:
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
                out = self._forward(self._tensor([[token]]), 1, past_key_values=out.past_key_values, use_cache=True)
        return self.tokenizer.decode(generated, skip_special_tokens=True), steps

    def _pick(self, logits: Any, temperature: float, generator: Any) -> int:
        torch = self._torch
        if temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / temperature, dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=generator))


__all__ = ["INSTALL_HINT", "TOP_ALTERNATIVES", "TransformersEngine", "convert_gguf"]
