"""A checkpoint's chat template, found and rendered the way ``transformers`` does.

Where the template lives (``find_template``), first found wins, as transformers reads them:
``chat_template.jinja`` beside the tokenizer, the ``chat_template`` of ``chat_template.json``
(the processors' older file), then ``tokenizer_config.json``'s ``chat_template`` (a string, or
a list of ``{"name", "template"}`` of which the ``default`` one is used). A GGUF checkpoint
(a ``.gguf`` path) carries its own: ``tokenizer.chat_template`` and its special tokens
(``engine.gguf_tokenizer``).

Rendering follows ``transformers.utils.chat_template_utils``: an immutable sandboxed jinja2
environment with ``trim_blocks`` and ``lstrip_blocks``, ``loopcontrols``, a ``tojson`` filter
that keeps non-ASCII characters and does not escape HTML, the ``raise_exception`` and
``strftime_now`` globals, and ``dict``/``namespace`` that cannot reach Python internals. The
template sees ``messages``, ``add_generation_prompt``, ``tools`` and ``documents`` (None) and
the tokenizer's named special tokens (``bos_token``, ``eos_token``, ...). Templates come from
checkpoints downloaded from anywhere: they are untrusted code, hence the sandbox.

Lives in control/ so that jinja2 stays out of the engine's dependencies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from engine.gguf_tokenizer import gguf_tokenizer
from engine.model.gguf_file import is_gguf

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_JSON = "chat_template.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The named special tokens a template sees as variables (transformers' ``special_tokens_map``)."""


class ChatTemplateError(ValueError):
    """The template refused the conversation (``raise_exception``) or failed while rendering;
    the message is the template's own."""


class _Namespace(Namespace):
    """jinja's ``namespace`` that refuses attribute names starting with ``_``."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _Dict:
    """``dict(...)`` and ``dict.fromkeys(...)`` in a template, without the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_Dict(),
        namespace=_Namespace,
    )
    return env.from_string(source)


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    """The file it was read from."""

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation (messages as plain dicts: ``role``, ``content``);
        raises ``ChatTemplateError`` when the template refuses it."""
        try:
            template = _compile(self.source)
            return template.render(
                **self.special_tokens,
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(str(exc) or type(exc).__name__) from exc


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _named(templates: Any) -> str | None:
    """``tokenizer_config.json``'s ``chat_template``: a string, or named ones (``default``)."""
    if isinstance(templates, str):
        return templates
    if isinstance(templates, list):
        by_name = {t.get("name"): t.get("template") for t in templates if isinstance(t, dict)}
        default = by_name.get("default")
        return default if isinstance(default, str) else None
    return None


def find_template(model_dir: Path) -> tuple[str, Path] | None:
    """The template's text and the file holding it, or None when the checkpoint has none."""
    if is_gguf(model_dir):
        source = gguf_tokenizer(model_dir).chat_template
        return None if source is None else (source, model_dir)
    if (path := model_dir / TEMPLATE_FILE).is_file():
        return path.read_text(encoding="utf-8"), path
    path = model_dir / TEMPLATE_JSON
    if (source := _named(_read_json(path).get("chat_template"))) is not None:
        return source, path
    path = model_dir / TOKENIZER_CONFIG
    if (source := _named(_read_json(path).get("chat_template"))) is not None:
        return source, path
    return None


@lru_cache(maxsize=4)
def load_chat_template(model_dir: Path) -> ChatTemplate | None:
    """The checkpoint's template with its special tokens, read once per folder; None without
    one. A template that does not compile raises ``ChatTemplateError``."""
    found = find_template(model_dir)
    if found is None:
        return None
    source, path = found
    if is_gguf(model_dir):
        tokens = dict(gguf_tokenizer(model_dir).special_tokens)
    else:
        config = _read_json(model_dir / TOKENIZER_CONFIG)
        tokens = {name: text for name in SPECIAL_TOKENS if (text := _token_text(config.get(name)))}
    try:
        _compile(source)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"{path.name}: the chat template does not compile: {exc}") from exc
    return ChatTemplate(source, tokens, path)
