"""A checkpoint's ``tokenizer.json`` read by the ``tokenizers`` package alone: the model jobs'
tokenizer, without importing transformers (0.5-1 s of every generate and timing job's start-up).

``LightTokenizer`` has the part of transformers' fast tokenizer the jobs use: ``tok(text,
add_special_tokens=False)["input_ids"]``, ``decode``, ``convert_tokens_to_ids``, the special
tokens of tokenizer_config.json and their ids, ``len``, ``add_tokens`` and
``apply_chat_template`` (the template rendered by jinja2 in the sandboxed environment
transformers uses, with its ``tojson``, ``raise_exception`` and ``strftime_now``).
``light_tokenizer`` returns one only where that is all the checkpoint needs, and None where
transformers must read it (tokenizer.py then does): no tokenizer.json, a Qwen-family BPE given
as vocab.json + merges.txt (read with transformers' Qwen2 classes), tokenizer_config.json asking
for ``clean_up_tokenization_spaces``, or a chat template with transformers' ``{% generation %}``
tag. tests/test_job_startup.py checks that it encodes, decodes and renders chat prompts as
transformers does on every family's test checkpoint and the shipped toys.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from .errors import read_json

#: tokenizer_config.json's special tokens passed to a chat template (transformers'
#: ``special_tokens_map``)
SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _chat_template(path: Path, config: dict) -> str | None:
    file = path / "chat_template.jinja"
    if file.is_file():  # transformers: the file wins over tokenizer_config.json's key
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


class LightTokenizer:
    def __init__(self, path: Path, config: dict, template: str | None):
        from tokenizers import AddedToken, Tokenizer

        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.chat_template = template
        self._special = {k: _content(config[k]) for k in SPECIAL if _content(config.get(k))}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        self._extra = [_content(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
        # the tokens transformers adds on load: the declared added tokens the file lacks, and the
        # special tokens (as special)
        decoder = config.get("added_tokens_decoder") or {}
        for i, entry in sorted(decoder.items(), key=lambda kv: int(kv[0])):
            if isinstance(entry, dict) and self._tok.token_to_id(entry["content"]) is None:
                token = AddedToken(entry["content"], special=entry.get("special", True),
                                   normalized=entry.get("normalized", False),
                                   lstrip=entry.get("lstrip", False), rstrip=entry.get("rstrip", False),
                                   single_word=entry.get("single_word", False))
                self._tok.add_tokens([token])
        missing = [t for t in [*self._special.values(), *self._extra] if self._tok.token_to_id(t) is None]
        if missing:
            self._tok.add_special_tokens(list(dict.fromkeys(missing)))

    # ---- transformers' fast tokenizer, the part the jobs use --------------------------------
    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self._tok.encode(text, add_special_tokens=add_special_tokens).ids}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        i = self._tok.token_to_id(token)
        return self.unk_token_id if i is None else i

    def convert_ids_to_tokens(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def add_tokens(self, tokens) -> int:
        return self._tok.add_tokens(list(tokens))

    def __getattr__(self, name: str):
        # bos_token ... mask_token (None when not declared) and their ids
        if name in SPECIAL:
            return self._special.get(name)
        if name.endswith("_id") and name[:-3] in SPECIAL:
            token = self._special.get(name[:-3])
            return None if token is None else self._tok.token_to_id(token)
        raise AttributeError(name)

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str | list[int]:
        text = _compiled(self.chat_template).render(
            messages=messages, tools=None, documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._special, additional_special_tokens=self._extra)
        return self.encode(text, add_special_tokens=False) if tokenize else text


_TEMPLATES: dict[str, object] = {}


def _compiled(template: str):
    """The template in transformers' environment (utils/chat_template_utils.py): sandboxed,
    trim_blocks, lstrip_blocks, loop controls, JSON without HTML escaping."""
    if template not in _TEMPLATES:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _TEMPLATES[template] = env.from_string(template)
    return _TEMPLATES[template]


def light_tokenizer(path: Path, bpe: bool) -> LightTokenizer | None:
    """The checkpoint's tokenizer without transformers, or None where transformers must read it
    (the module docstring says when). ``bpe``: the family reads vocab.json + merges.txt first."""
    found = _light_files(path, bpe)
    return None if found is None else LightTokenizer(path, *found)


def needs_transformers(path: Path, bpe: bool) -> bool:
    """Whether ``light_tokenizer`` leaves this checkpoint to transformers, without reading its
    tokenizer (the job server's preload, dlmpipe/jobserver.py)."""
    return _light_files(path, bpe) is None


def _light_files(path: Path, bpe: bool) -> tuple[dict, str | None] | None:
    """tokenizer_config.json's content and the chat template where ``light_tokenizer`` applies,
    else None."""
    if not (path / "tokenizer.json").is_file():
        return None
    if bpe and (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return None
    config_file = path / "tokenizer_config.json"
    config = read_json(config_file, "tokenizer_config.json") if config_file.is_file() else {}
    template = _chat_template(path, config)
    if config.get("clean_up_tokenization_spaces") or (template and "generation" in template
                                                       and "endgeneration" in template):
        return None
    return config, template
