"""What `--model` and `--weights` name, for generate and run: the geometry (config), the weights
folder if any, and the tokenizer (the weights folder's first, else the model folder's).

``resolve_model_source(model, weights_dir)`` -> (ModelConfig, weights folder or None, tokenizer or
None, the folder the tokenizer was looked for in or None). Either may be None: the default is the
--weights folder's config.json, else the default preset with seeded synthetic weights.
"""

from __future__ import annotations

from pathlib import Path

from .errors import UserError


def resolve_model_source(model, weights_dir: Path | None):
    """generate's and run's model: (config, the weights folder or None, the tokenizer or None,
    the folder it was looked for in or None). --model DIR with weights is the weights unless
    --weights says otherwise; --weights alone takes its folder's config.json; both must be the
    same geometry."""
    from .config import DEFAULT_PRESET, load_config, resolve_model

    if weights_dir is not None and not (weights_dir / "config.json").is_file():
        raise UserError(f"--weights {str(weights_dir)!r} is not a checkpoint folder with a "
                        "config.json")
    resolved = resolve_model(model if model is not None else (weights_dir or DEFAULT_PRESET))
    cfg = resolved.config
    if weights_dir is None and resolved.has_weights:
        weights_dir = resolved.model_dir
    elif weights_dir is not None and model is not None:
        own = load_config(weights_dir)
        if own.hash != cfg.hash:
            raise UserError(f"--model {model!r} (config {cfg.hash}) is not the geometry of "
                            f"--weights {str(weights_dir)!r} (config {own.hash}); leave --model "
                            "out to use the folder's config.json")
    from .tokenizer import load_tokenizer

    tok = None
    for d in (weights_dir, resolved.model_dir):   # the weights' own tokenizer first
        if d is not None and tok is None:
            tok = load_tokenizer(d)
    return cfg, weights_dir, tok, weights_dir or resolved.model_dir
