"""Do-not-translate spans: what is masked, and that restore() puts every span back verbatim whatever the model did."""

from __future__ import annotations

import pytest

from hunyuan_mt.text.masking import Protected, protect, restore, sentinel_tokens


@pytest.mark.parametrize(
    ("text", "masked", "spans"),
    [
        ("Could not open %s: %(err)s", "Could not open ⟦0⟧: ⟦1⟧", ["%s", "%(err)s"]),
        ("Saved {0} files to {path}.", "Saved ⟦0⟧ files to ⟦1⟧.", ["{0}", "{path}"]),
        ("Width {w:>8} and {}", "Width ⟦0⟧ and ⟦1⟧", ["{w:>8}", "{}"]),
        ("Click <b>here</b> now", "Click ⟦0⟧here⟦1⟧ now", ["<b>", "</b>"]),
        ('<a href="x.html">Link</a>', "⟦0⟧Link⟦1⟧", ['<a href="x.html">', "</a>"]),
        ("Visit https://example.com/a?b=1.", "Visit ⟦0⟧.", ["https://example.com/a?b=1"]),
        ("Mail foo.bar@x.org, please", "Mail ⟦0⟧, please", ["foo.bar@x.org"]),
        ("Run `ls -la` now", "Run ⟦0⟧ now", ["`ls -la`"]),
        ("It costs 3.50 at 10:30", "It costs ⟦0⟧ at ⟦1⟧", ["3.50", "10:30"]),
        ("Use %1, %% and ${HOME}", "Use ⟦0⟧, ⟦1⟧ and ⟦2⟧", ["%1", "%%", "${HOME}"]),
        ("Tom &amp; Jerry", "Tom ⟦0⟧ Jerry", ["&amp;"]),
        ("%-5d items, %.2f%%", "⟦0⟧ items, ⟦1⟧⟦2⟧", ["%-5d", "%.2f", "%%"]),
    ],
)
def test_protect_masks_each_kind_of_span(text: str, masked: str, spans: list[str]) -> None:
    protected = protect(text)
    assert protected.text == masked
    assert protected.spans == spans
    assert restore(protected.text, protected) == text


def test_words_with_digits_are_left_alone() -> None:
    assert protect("MP3 player on x86_64 with utf8").spans == []


def test_literal_sentinel_in_input_is_itself_protected() -> None:
    protected = protect("Type ⟦3⟧ here")
    assert protected.text == "Type ⟦0⟧ here"
    assert restore("Escribe ⟦0⟧ aquí", protected) == "Escribe ⟦3⟧ aquí"


def test_restore_after_reordering() -> None:
    protected = protect("Copy %s to %d")
    assert restore("⟦1⟧ bekommt ⟦0⟧", protected) == "%d bekommt %s"


def test_restore_drops_duplicates_and_invented_sentinels() -> None:
    protected = protect("Open %s now.")
    assert restore("Abrir ⟦0⟧ ⟦0⟧ ahora ⟦7⟧.", protected) == "Abrir %s ahora."


def test_restore_appends_dropped_span_at_end() -> None:
    protected = protect("Open %s now")
    assert restore("Abrir ahora", protected) == "Abrir ahora %s"


def test_restore_appends_dropped_span_before_final_punctuation_when_source_had_it_there() -> None:
    protected = protect("Saved to %s.")
    assert restore("Guardado en.", protected) == "Guardado en %s."


def test_restore_tolerates_spaced_and_ascii_sentinels() -> None:
    protected = protect("See {0} and {1}")
    assert restore("Siehe ⟦ 0 ⟧ und [[1]]", protected) == "Siehe {0} und {1}"


def test_restore_without_spans_removes_invented_sentinels_only() -> None:
    protected = protect("Hello world")
    assert protected.spans == []
    assert restore("Hola mundo", protected) == "Hola mundo"
    assert restore("Hola ⟦0⟧ mundo", protected) == "Hola mundo"


def test_has_words() -> None:
    assert not protect("https://example.com").has_words
    assert not protect("{0}: %s").has_words
    assert protect("Open %s").has_words


def test_every_span_survives_any_output() -> None:
    text = "Error %(code)d at <b>{path}</b>: see https://x.org or mail a@b.cc"
    protected = protect(text)
    for garbage in ("", "⟦4⟧⟦4⟧⟦4⟧", "nothing at all", "⟦3⟧ ⟦2⟧ ⟦1⟧ ⟦0⟧ ⟦5⟧ ⟦4⟧ ⟦9⟧"):
        out = restore(garbage, protected)
        for span in protected.spans:
            assert out.count(span) == text.count(span), (garbage, span, out)


def test_sentinel_tokens() -> None:
    assert sentinel_tokens(3) == ["⟦0⟧", "⟦1⟧", "⟦2⟧"]
    assert Protected("x").spans == []
