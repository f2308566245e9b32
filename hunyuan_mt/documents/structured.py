"""JSON and YAML string files (.json, .yaml, .yml): the string values are translated; keys, numbers, booleans,
nulls, structure and order are kept.

These are how web and mobile apps keep their UI strings (i18next, Rails, Symfony, Flutter's ARB): nested objects
whose leaves are the texts. A leaf with no letter (a URL is still a string with letters, so it goes to the model,
whose masking keeps it verbatim) or a key starting with "@" (ARB's metadata) is left alone. Placeholders
(`{{count}}`, `%{name}`, `{name}`) are masking spans like everywhere else.

JSON is read and written with the standard library, with the file's own indentation. YAML goes through
ruamel.yaml in round-trip mode, the YAML library that keeps comments, anchors and aliases, key order and each
string's quoting style (PyYAML drops comments and expands aliases); an anchored string is translated once and
every alias follows it.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from ..config import LimitsConfig
from ..errors import InputTooLarge, InvalidInput, UnsupportedLanguage
from ..text.languages import normalize_code
from .base import Document, RenderedDocument, needs_translation, output_filename, split_outer_whitespace
from .encoding import decode_text

_NOTE = "Only the string values were translated; keys, numbers and structure are kept."
#: Containers nested inside each other, at most. Real catalogues nest a few levels; a parser or walker recursing
#: through thousands ran out of stack (a 500 before; tests/test_hostile_input.py).
MAX_NESTING = 200
_INDENT = re.compile(r"^\{\s*\n([ \t]+)\S", re.M)
_LOCALE_KEY = re.compile(r"^[a-z]{2,3}(?:[-_][A-Za-z]{2,4})?$")


#: Plain YAML scalars that YAML 1.1 readers (Ruby's Psych, so Rails; PyYAML) take as booleans: not text.
_YAML11_BOOLEANS = {"yes", "no", "on", "off", "y", "n", "true", "false"}


def _children(node: Any) -> list[tuple[Any, Any]]:
    """(key or index, value) of a mapping's or a list's children; none for a leaf."""
    return list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []


def _leaves(node: Any, skip_key: Callable[[Any], bool],
            skip_value: Callable[[str], bool] = lambda value: False) -> Iterator[tuple[Any, Any]]:
    """(container, key or index) of every string leaf that needs translating, depth first in document order;
    a string or a container met twice (a YAML alias) is walked once: an alias bomb (each list aliasing the one
    before ten times) is a few objects but exponentially many paths, and took 83 s at 364 bytes walked by path."""
    seen: set[int] = set()

    def walk(value: Any, depth: int) -> Iterator[tuple[Any, Any]]:
        if id(value) in seen:
            return
        seen.add(id(value))
        if depth > MAX_NESTING:
            raise InputTooLarge(f"containers nested more than {MAX_NESTING} deep; the limit is {MAX_NESTING}")
        for key, child in _children(value):
            if isinstance(value, dict) and skip_key(key):
                continue
            if isinstance(child, str):
                if needs_translation(child) and not skip_value(child) and id(child) not in seen:
                    seen.add(id(child))
                    yield value, key
            else:
                yield from walk(child, depth + 1)

    return walk(node, 0)


def _rename_locale_root(tree: Any, target: str) -> None:
    """A Rails-style catalogue (`en:` over everything; vue-i18n's JSON does the same) names its language in its one
    top-level key: the translated file answers to the target's code, or the app would still load it as English.
    Only a lone key shaped like a locale ("en", "pt-BR", "zh_CN") whose value is a mapping is taken for one."""
    if not isinstance(tree, dict) or len(tree) != 1:
        return
    (key, value), = tree.items()
    if not (isinstance(key, str) and _LOCALE_KEY.match(key) and isinstance(value, dict)):
        return
    try:
        normalize_code(key)
    except UnsupportedLanguage:
        return
    if key == target:
        return
    if hasattr(tree, "insert"):  # ruamel's CommentedMap: the comments and position stay with the key
        tree.insert(0, target, value)
        del tree[key]
    else:
        tree.clear()
        tree[target] = value


class _StringsDocument(Document):
    """A tree whose string leaves are the segments; subclasses read and write the tree."""

    extension = ".json"
    media_type = "application/json"

    def __init__(self, filename: str, tree: Any) -> None:
        self._tree = tree
        try:
            self._places = list(_leaves(tree, lambda key: isinstance(key, str) and key.startswith("@"),
                                        self._not_text))
        except InputTooLarge as exc:
            raise InputTooLarge(f"{filename}: {exc.message}") from None
        # The translator gets each text without its outer whitespace (a folded YAML block ends in a newline),
        # which goes back around the translation.
        self._outer = [split_outer_whitespace(container[key]) for container, key in self._places]
        super().__init__(filename, [core for _, core, _ in self._outer])

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        originals = {id(container[key]): lead + translation.strip() + trail for (container, key), translation,
                     (lead, _, trail) in zip(self._places, translations, self._outer)}
        self._replace(self._tree, originals, {}, set())
        if target:
            _rename_locale_root(self._tree, target)
        return RenderedDocument(self._dump(self._tree).encode("utf-8"),
                                output_filename(self.filename, self.extension, target), self.media_type, _NOTE)

    def _replace(self, node: Any, translated: dict[int, str], made: dict[int, Any], done: set[int]) -> None:
        """Every leaf in `translated` replaced; one new object per original, so a YAML alias and its anchor stay
        one object; each container once (`done`), however many aliases lead to it."""
        if id(node) in done:
            return
        done.add(id(node))
        for key, child in _children(node):
            if isinstance(child, str):
                if id(child) in translated:
                    if id(child) not in made:
                        made[id(child)] = self._string(child, translated[id(child)])
                    node[key] = made[id(child)]
            else:
                self._replace(child, translated, made, done)

    def _string(self, original: Any, translation: str) -> Any:
        return translation

    @staticmethod
    def _not_text(value: str) -> bool:
        return False

    def _dump(self, tree: Any) -> str:
        raise NotImplementedError


class JsonDocument(_StringsDocument):
    kind = "json"

    def __init__(self, filename: str, text: str) -> None:
        try:
            tree = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{filename}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                               f"{exc.msg})") from None
        except RecursionError:
            raise _too_deep(filename) from None
        indent = _INDENT.search(text)
        self._indent = indent.group(1) if indent else None
        super().__init__(filename, tree)

    def _dump(self, tree: Any) -> str:
        return json.dumps(tree, ensure_ascii=False, indent=self._indent) + "\n"


class YamlDocument(_StringsDocument):
    kind = "yaml"
    media_type = "application/yaml"

    def __init__(self, filename: str, text: str) -> None:
        from ruamel.yaml import YAML
        from ruamel.yaml.error import YAMLError

        if _flow_depth(text) > MAX_NESTING:
            # ruamel's parser is slow on deep flow collections (a 2 KB file nested 1,100 deep took 4.2 s before it
            # gave up): refused before it starts.
            raise _too_deep(filename)
        self._yaml = YAML(typ="rt")
        self._yaml.preserve_quotes = True
        self._yaml.width = 4096  # never re-wrap a translated line
        try:
            tree = self._yaml.load(text)
        except YAMLError as exc:
            raise InvalidInput(f"{filename}: not valid YAML ({str(exc).splitlines()[0][:160]})") from None
        except RecursionError:
            raise _too_deep(filename) from None
        self.extension = ".yml" if filename.lower().endswith(".yml") else ".yaml"
        super().__init__(filename, tree)

    @staticmethod
    def _not_text(value: str) -> bool:
        # `enabled: yes` is true to Rails; a quoted "Yes" is a string of every reader, and is translated.
        return type(value) is str and value.lower() in _YAML11_BOOLEANS

    def _string(self, original: Any, translation: str) -> Any:
        # Keep the original's quoting style (and its anchor, for the aliases that point at it).
        kind = type(original)
        value = kind(translation) if kind is not str else translation
        anchor = getattr(original, "anchor", None)
        if anchor is not None and getattr(anchor, "value", None) and hasattr(value, "yaml_set_anchor"):
            value.yaml_set_anchor(anchor.value, always_dump=True)
        return value

    def _dump(self, tree: Any) -> str:
        out = io.StringIO()
        self._yaml.dump(tree, out)
        return out.getvalue()


def _flow_depth(text: str) -> int:
    """The deepest nesting of YAML flow collections (`[`, `{`) in `text`, outside quoted scalars and comments: one
    pass, an upper bound on what the parser will recurse through for them."""
    depth = deepest = 0
    quote = None
    previous = "\n"
    for ch in text:
        if quote is not None:
            if ch == quote:
                quote = None
        elif ch in "\"'" and previous in " \t\n[{,:":
            quote = ch
        elif ch == "#" and previous in " \t\n":
            quote = "\n"          # a comment runs to the end of its line
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}" and depth:
            depth -= 1
        previous = ch
    return deepest


def _too_deep(filename: str) -> InputTooLarge:
    return InputTooLarge(f"{filename}: containers nested more than {MAX_NESTING} deep; the limit is {MAX_NESTING}")


def read_json(data: bytes, filename: str, limits: LimitsConfig) -> JsonDocument:
    return JsonDocument(filename, decode_text(data, filename).text)


def read_yaml(data: bytes, filename: str, limits: LimitsConfig) -> YamlDocument:
    return YamlDocument(filename, decode_text(data, filename).text)
