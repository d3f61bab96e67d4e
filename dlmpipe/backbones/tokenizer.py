"""A checkpoint's tokenizer, without remote code, and the special ids it declares.

The tokenizer classes are named explicitly (never ``AutoTokenizer``, never ``trust_remote_code``);
special ids (mask, stop, pad) always come from the checkpoint's own files.
"""
from __future__ import annotations

from pathlib import Path

from .checkpoint_config import CheckpointError, _read_json, _unique, read_config
from .families import family as family_named
from .model import BackboneConfig


def load_tokenizer(path: Path, family: str | None = None, light: bool = False):
    """The checkpoint's tokenizer, without remote code.

    LLaDA ships a fast ``tokenizer.json``. The Qwen-based families (``Family.bpe_tokenizer``;
    Dream/DiffuCoder name a remote-code ``DreamTokenizer``) are a Qwen2 byte-level BPE over
    vocab.json + merges.txt, so transformers' own Qwen2 tokenizer reads those files; the added
    tokens (``<|mask|>``, ...) come from tokenizer_config.json / added_tokens.json and are checked
    to land on their declared ids.

    ``light``: read tokenizer.json with the ``tokenizers`` package alone where that is all the
    checkpoint needs (light_tokenizer.py: the same ids and text, without importing transformers;
    the model jobs' start-up), else transformers as above.
    """
    path = Path(path)
    bpe = family_named(family or read_config(path).family).bpe_tokenizer
    if light:
        from .light_tokenizer import light_tokenizer

        tok = light_tokenizer(path, bpe)
        if tok is not None:
            _check_added_tokens(tok, path)
            return tok
    has_bpe = (path / "vocab.json").is_file() and (path / "merges.txt").is_file()
    has_fast = (path / "tokenizer.json").is_file()
    if bpe and has_bpe:
        cls, file = transformers_class(bpe=True), path / "vocab.json"
    elif has_fast:
        cls, file = transformers_class(bpe=False), path / "tokenizer.json"
    else:
        want = "vocab.json + merges.txt (or tokenizer.json)" if bpe else "tokenizer.json"
        raise CheckpointError(f"{path}: tokenizer missing (expected {want})")
    try:
        tok = cls.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure inside transformers, re-raised with the file named
        raise CheckpointError(f"{file}: cannot load tokenizer ({type(e).__name__}: {e})") from e
    _check_added_tokens(tok, path)
    return tok


def transformers_class(bpe: bool):
    """The transformers class ``load_tokenizer`` reads a checkpoint with where the light
    tokenizer does not apply: Qwen2's BPE (fast where transformers has it) for vocab.json +
    merges.txt, else the fast tokenizer of a tokenizer.json. Importing Qwen2's is most of such a
    job's tokenizer cost (~1 CPU s: transformers' model index); the job server imports it once
    for a campaign that needs it (``preload_for``)."""
    import transformers

    if bpe:
        return getattr(transformers, "Qwen2TokenizerFast", None) or transformers.Qwen2Tokenizer
    return transformers.PreTrainedTokenizerFast


def preload_for(checkpoints) -> bool:
    """Import the ``transformers_class`` of each of ``checkpoints`` (directories) that
    transformers reads (light_tokenizer.py says which: e.g. Dream's vocab.json + merges.txt)
    ahead of the model jobs: the job server, before it forks any (dlmpipe/jobserver.py). Returns
    whether it imported any. A directory that is missing or unreadable is skipped: its own jobs
    say what is wrong."""
    from .light_tokenizer import needs_transformers

    imported = set()
    for path in map(Path, checkpoints):
        try:
            bpe = family_named(read_config(path).family).bpe_tokenizer
            if needs_transformers(path, bpe):
                # the class load_tokenizer picks: Qwen2's where the BPE files are there
                imported.add(bpe and (path / "vocab.json").is_file() and (path / "merges.txt").is_file())
        except Exception:  # noqa: BLE001 - only a preload: the job reads it and fails in its own words
            continue
    for bpe in imported:
        transformers_class(bpe)
    return bool(imported)


def _declared_added_tokens(path: Path) -> dict[str, int]:
    """The added tokens a directory declares: tokenizer_config.json's ``added_tokens_decoder``,
    or, only where it has none, the legacy added_tokens.json (transformers' own precedence; SDAR's
    release names its mask ``<|MASK|>`` in the first and ``<MASK>`` in the second)."""
    declared: dict[str, int] = {}
    tc_file = path / "tokenizer_config.json"
    decoder = (_read_json(tc_file, "tokenizer_config.json").get("added_tokens_decoder") or {}
               if tc_file.is_file() else {})
    added_file = path / "added_tokens.json"
    if added_file.is_file() and not decoder:
        declared |= {str(k): v for k, v in _read_json(added_file, "added_tokens.json").items()}
    if decoder:
        for i, entry in decoder.items():
            content = entry.get("content") if isinstance(entry, dict) else None
            if content is None or not str(i).isdigit():
                raise CheckpointError(f"{tc_file}: malformed added_tokens_decoder entry {i!r}: {entry!r}")
            declared[content] = int(i)
    return declared


def _check_added_tokens(tok, path: Path) -> None:
    """Add declared tokens the tokenizer class skipped (in id order), then insist on the ids."""
    from tokenizers import AddedToken

    declared = _declared_added_tokens(path)
    for content, i in sorted(declared.items(), key=lambda kv: kv[1]):
        if tok.convert_tokens_to_ids(content) in (None, tok.unk_token_id) and i == len(tok):
            tok.add_tokens([AddedToken(content, special=True, normalized=False)])
    wrong = {c: (i, tok.convert_tokens_to_ids(c)) for c, i in declared.items()
             if tok.convert_tokens_to_ids(c) != i}
    if wrong:
        c, (i, got) = next(iter(wrong.items()))
        raise CheckpointError(f"{path}: added token {c!r} is declared with id {i} but the tokenizer "
                              f"gives {got} ({len(wrong)} such token(s))")


def _token_id(tok, token: str) -> int | None:
    i = tok.convert_tokens_to_ids(token)
    return None if i is None or (i == tok.unk_token_id and token != tok.unk_token) else i


def resolve_special_ids(cfg: BackboneConfig, tok, path: Path) -> BackboneConfig:
    """Fill mask / stop / pad ids from the tokenizer where config.json leaves them open.

    Mask: config.json's ``mask_token_id``, else the tokenizer's mask token, else the family's
    mask token by name (without a tokenizer: by name among the added tokens its files declare;
    Fast-dLLM v2's config.json has no mask_token_id). Stops: config/generation_config eos ids, the tokenizer's eos, and the
    family's end-of-turn tokens present in the vocabulary (``<|eot_id|>``, ``<|im_end|>``,
    DiffuCoder's ``<|dlm_pad|>``). Pad: DiffuCoder's ``<|dlm_pad|>``, else config.json's
    ``pad_token_id``, else the tokenizer's pad, else the first stop id.
    """
    fam = family_named(cfg.family)
    if tok is not None:
        if cfg.mask_id is None:
            cfg.mask_id = tok.mask_token_id if getattr(tok, "mask_token", None) else None
        for name in fam.mask_tokens:
            cfg.mask_id = cfg.mask_id if cfg.mask_id is not None else _token_id(tok, name)
        cfg.stop_ids = _unique(cfg.stop_ids + [tok.eos_token_id] + [_token_id(tok, n) for n in fam.stop_tokens])
        pads = [_token_id(tok, n) for n in fam.pad_tokens] + [cfg.pad_id, tok.pad_token_id]
        cfg.pad_id = next((p for p in pads if p is not None), None)
    if cfg.mask_id is None and tok is None:  # loaded without a tokenizer: its declared added tokens
        declared = _declared_added_tokens(path)
        cfg.mask_id = next((declared[n] for n in fam.mask_tokens if n in declared), None)
    if cfg.mask_id is None:
        raise CheckpointError(f"{path / 'config.json'}: no mask token id (no mask_token_id field and no "
                              f"{' / '.join(fam.mask_tokens)} in the tokenizer)")
    if not cfg.stop_ids:
        raise CheckpointError(f"{path / 'config.json'}: no stop token id (no eos_token_id and no tokenizer eos)")
    if cfg.pad_id is None:
        cfg.pad_id = cfg.stop_ids[0]
    for name, i in [("mask", cfg.mask_id), ("pad", cfg.pad_id)] + [("stop", s) for s in cfg.stop_ids]:
        if not 0 <= i < cfg.vocab_size:
            raise CheckpointError(f"{path / 'config.json'}: {name} token id {i} is outside the "
                                  f"vocabulary of {cfg.vocab_size}")
    return cfg
