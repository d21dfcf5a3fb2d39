"""Loading for the ``transformers`` engine: lazy imports of the optional extra, GGUF conversion.

Nothing here downloads anything unless the caller names a hub model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install 'dp-textgrad[hf]'"


def import_hf() -> tuple[Any, Any]:
    """Import torch and transformers lazily: they are an optional extra."""
    try:
        import torch
        import transformers
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            f"TransformersEngine needs torch and transformers, which are not installed: {INSTALL_HINT}"
        ) from exc
    return torch, transformers


def drop_dequantized_gguf_marker(model: Any) -> None:
    """transformers loads a GGUF by dequantizing it (unless the optional ``kernels``
    package keeps blocks packed) but leaves a quantizer attached that refuses
    ``save_pretrained`` and dtype changes. When every weight is a plain floating
    tensor, the marker is stale: remove it."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or "gguf" not in type(quantizer).__name__.lower():
        return
    import torch

    plain = all(type(p) in (torch.Tensor, torch.nn.Parameter) and p.is_floating_point() for p in model.parameters())
    packed = any("gguf" in type(m).__name__.lower() for m in model.modules())
    if plain and not packed:
        quantizer.remove_quantization_config(model)


def convert_gguf(
    gguf_path: str | os.PathLike[str], output_dir: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Dequantize a GGUF checkpoint once into a transformers directory (float32).

    Loading a GGUF through transformers parses its metadata and dequantizes every
    tensor, which takes minutes on a small CPU; the converted directory loads in
    seconds. Returns ``output_dir`` at once when it already exists (unless
    ``overwrite``). Writes only there, atomically: into a temporary sibling, then a
    rename, so an interrupted conversion leaves nothing half-written. Needs the
    ``gguf`` and ``accelerate`` packages.
    """
    torch, transformers = import_hf()
    source = Path(gguf_path)
    target = Path(output_dir)
    if not source.is_file():
        raise FileNotFoundError(f"gguf_path: no such file: {source}")
    if target.exists() and not overwrite:
        return target
    options = {"gguf_file": source.name, "local_files_only": True}
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.parent), **options)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source.parent), dtype=torch.float32, **options)
    drop_dequantized_gguf_marker(model)
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


def chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
