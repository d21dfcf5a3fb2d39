"""The task and the engine that a run file's sections name.

Library code (the CLI, federated runs and deployments) builds them here, so that nothing
below the command line imports the CLI. The CLI re-exports both names; tests replace
``cli.make_engine`` to give CLI runs a scripted engine.
"""

from __future__ import annotations

from dp_textgrad.settings import DEFAULT_FILE_SEED_PROMPT, EngineSection, TaskSection


def build_task(section: TaskSection):
    options = dict(section.options)
    try:
        if section.name is not None:
            from dp_textgrad.tasks.registry import get_task

            return get_task(section.name, **options)
        from dp_textgrad.tasks.loaders import build_task_from_files

        if section.record_template is not None:
            options["record_template"] = section.record_template
        options["seed_prompt"] = section.seed_prompt or DEFAULT_FILE_SEED_PROMPT
        return build_task_from_files(
            "custom", section.train, section.test, public=section.public, labels=section.labels,
            text_column=section.text_column, label_column=section.label_column,
            description=section.description, encoding=section.encoding, **options,
        )
    except TypeError as exc:
        raise ValueError(f"task.options: not accepted by the task builder ({exc})") from None


def make_engine(section: EngineSection):
    """The engine a configuration names."""
    from dp_textgrad.engines.registry import build_engine

    return build_engine(section.kind, model=section.model, base_url=section.base_url, mode=section.mode,
                        **section.options)


def engine_follows_instructions(section: EngineSection) -> bool:
    """Whether the engine a section names follows rewrite instructions, decided without loading it.

    It decides ``llm_operators`` when the configuration leaves it open, and so the plan:
    ``budget`` asks here what ``optimize`` will read from the built engine. The default
    llama.cpp model (Gemma 3 270M) is a base model; a user's GGUF is taken as instruction-tuned
    unless ``engine.options.instruction_following`` says otherwise (as ``LlamaCppEngine`` does).
    The other kinds keep the engine base class's declaration, ``Engine.instruction_following``
    (True; not imported here: the engines package takes most of a second to import, and
    ``budget`` loads nothing it does not use; a test holds the two equal).
    """
    if section.kind == "llama_cpp":
        declared = section.options.get("instruction_following")
        return (section.model is not None) if declared is None else bool(declared)
    return True

