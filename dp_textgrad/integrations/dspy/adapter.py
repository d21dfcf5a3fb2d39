"""A DSPy adapter for completion (base) models, which continue text instead of following a chat format.

DSPy 3.4's text mode (``dspy.LM(..., model_type="text")``) joins the messages' contents with
blank lines and ends the prompt with ``BEGIN RESPONSE:`` (:class:`EngineLM` does the same for a
completion engine). The adapter lays the prompt out so that a base model continues it::

    <instructions>
    Input <field>: <its desc=>        (fields described with desc=)

    <input field>: <value>            (each demonstration)

    BEGIN RESPONSE: <first output value>
    <next output field>: <value>

    <input field>: <value>            (the call's inputs; the LM adds "BEGIN RESPONSE:")

and parses the continuation by field prefixes: the first output field's value runs up to a line
starting ``<next output field>:``, and so on; the LAST output field's value is its first
non-empty line (a base model writes on after the answer). Typed output fields (``Literal``,
``int``, ``bool``, ...) are parsed with DSPy's own value parser; a missing field or a value that
does not parse raises ``dspy.AdapterParseError``.
"""

from __future__ import annotations

from typing import Any

from dp_textgrad.integrations.dspy._env import import_dspy

dspy = import_dspy()
parse_value = import_dspy("dspy.adapters.utils").parse_value
_Adapter: Any = dspy.Adapter

#: The line DSPy 3.4's text mode puts before the model's response (the adapter's layout uses it).
RESPONSE_MARKER = "BEGIN RESPONSE:"


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "; ".join(str(item) for item in value)
    return str(value)


class CompletionAdapter(_Adapter):
    """Run ``dspy.Predict`` / ``dspy.ChainOfThought`` on a completion (base) model (module docstring).

    ``stop``: where the model's continuation is cut: ``"auto"`` where it starts another example
    (a blank line and the first input field, or ``BEGIN RESPONSE:``); a list of strings sets
    them; ``None`` sets none (the LM's ``max_tokens`` ends it). Pair it with
    ``dspy.LM(..., model_type="text")`` or :class:`EngineLM`:
    ``dspy.configure(lm=lm, adapter=CompletionAdapter())``.
    """

    def __init__(self, stop: str | list[str] | None = "auto", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if (
            stop is not None
            and stop != "auto"
            and not (isinstance(stop, list) and all(isinstance(item, str) and item for item in stop))
        ):
            raise ValueError("stop: use 'auto', None, or a list of non-empty strings")
        self.stop = stop

    # -- rendering ----------------------------------------------------------------------
    def render_descriptions(self, signature: Any) -> str:
        """A line per field whose ``desc=`` says more than its name: ``Input <name>: <desc>`` or
        ``Output <name>: <desc>`` (not ``<name>: ...``, which is how a value is written)."""
        lines = []
        for role, fields in (("Input", signature.input_fields), ("Output", signature.output_fields)):
            for name, field in fields.items():
                desc = str((field.json_schema_extra or {}).get("desc", "") or "").strip()
                if desc and desc != f"${{{name}}}":  # DSPy's placeholder for a field without desc=
                    lines.append(f"{role} {name}: {desc}")
        return "\n".join(lines)

    def render_inputs(self, signature: Any, values: dict[str, Any]) -> str:
        """The ``name: value`` lines of the input fields ``values`` holds."""
        names = signature.input_fields
        return "\n".join(f"{n}: {_text(values[n])}" for n in names if n in values and values[n] is not None)

    def render_demo(self, signature: Any, example: Any) -> str:
        """A demonstration: the inputs, then the response as the model should write it."""
        values = dict(example)
        outputs = [n for n in signature.output_fields if n in values and values[n] is not None]
        lines = [f"{RESPONSE_MARKER} {_text(values[outputs[0]])}"] if outputs else []
        lines += [f"{n}: {_text(values[n])}" for n in outputs[1:]]
        return "\n\n".join(part for part in (self.render_inputs(signature, values), "\n".join(lines)) if part)

    def format(self, signature: Any, demos: list[dict[str, Any]], inputs: dict[str, Any]) -> list[dict[str, Any]]:
        """The instructions, the fields' descriptions and the demonstrations as one user message,
        the call's inputs as a second (module docstring). A completion LM joins them with a blank
        line, as one text; :class:`EngineLM` keeps the first, the same for every record of a
        candidate, as a cached prefix."""
        blocks = [(signature.instructions or "").strip(), self.render_descriptions(signature)]
        blocks += [self.render_demo(signature, demo) for demo in demos]
        head = "\n\n".join(block for block in blocks if block)
        call = self.render_inputs(signature, dict(inputs))
        return [{"role": "user", "content": part} for part in (head, call) if part]

    def __call__(
        self,
        lm: Any,
        lm_kwargs: dict[str, Any],
        signature: Any,
        demos: list[dict[str, Any]],
        inputs: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """DSPy's adapter call, with the stop sequences of ``stop`` unless the call sets its own."""
        lm_kwargs = dict(lm_kwargs)
        stop = self._stop(signature)
        if stop and "stop" not in lm_kwargs:
            lm_kwargs["stop"] = stop
        return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    async def acall(
        self,
        lm: Any,
        lm_kwargs: dict[str, Any],
        signature: Any,
        demos: list[dict[str, Any]],
        inputs: dict[str, Any],
    ) -> list[dict[str, Any]]:
        lm_kwargs = dict(lm_kwargs)
        stop = self._stop(signature)
        if stop and "stop" not in lm_kwargs:
            lm_kwargs["stop"] = stop
        return await super().acall(lm, lm_kwargs, signature, demos, inputs)

    def _stop(self, signature: Any) -> list[str] | None:
        if self.stop == "auto":
            # Where the model starts the next example. Not at a blank line: a base model often
            # opens its answer with one, which would cut it to nothing.
            first_input = next(iter(signature.input_fields), None)
            return [f"\n\n{first_input}:", f"\n{RESPONSE_MARKER}"] if first_input else [f"\n{RESPONSE_MARKER}"]
        return list(self.stop) if self.stop else None

    # -- parsing ------------------------------------------------------------------------
    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        """The output fields read from the model's continuation by their prefixes (module docstring)."""
        names = list(signature.output_fields)
        text = completion.strip()
        if text.startswith(RESPONSE_MARKER):
            text = text[len(RESPONSE_MARKER) :].strip()
        if text.startswith(f"{names[0]}:"):
            text = text[len(names[0]) + 1 :]
        raw: dict[str, str] = {}
        current, position = names[0], 0
        collected: list[str] = []
        for line in text.split("\n"):
            following = names[position + 1] if position + 1 < len(names) else None
            if following is not None and line.strip().startswith(f"{following}:"):
                raw[current] = "\n".join(collected).strip()
                position += 1
                current, collected = following, [line.strip()[len(following) + 1 :]]
                continue
            collected.append(line)
        raw[current] = "\n".join(collected).strip()
        last = names[-1]
        if raw.get(last):  # the last field ends with its line; a base model writes on after it
            raw[last] = raw[last].split("\n", 1)[0].strip()
        missing = [name for name in names if not raw.get(name)]
        if missing:
            raise dspy.AdapterParseError(
                adapter_name="CompletionAdapter",
                signature=signature,
                lm_response=completion,
                message=f"no value for output field(s) {', '.join(missing)}",
            )
        parsed: dict[str, Any] = {}
        for name in names:
            try:
                parsed[name] = parse_value(raw[name], signature.output_fields[name].annotation)
            except (ValueError, TypeError) as exc:
                raise dspy.AdapterParseError(
                    adapter_name="CompletionAdapter",
                    signature=signature,
                    lm_response=completion,
                    message=f"output field {name} does not parse as its type ({type(exc).__name__})",
                ) from None
        return parsed


__all__ = ["CompletionAdapter"]
