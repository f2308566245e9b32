"""Markup placed in a whole-sentence translation (documents/alignment.py): the sentinels come back once each and in
order, around the words their pieces' own translations point to."""

from __future__ import annotations

import pytest

from hunyuan_mt.text import masking
from hunyuan_mt.documents.alignment import place_markup


def test_a_formatted_word_is_found_in_a_sentence_the_target_reorders() -> None:
    # "account" alone came back as nonsense from the demo; the memory knows it as "Cuenta".
    placed = place_markup("Your ⟦0⟧account⟦1⟧ has been created.", "Se ha creado la cuenta de usuario.",
                          ["Su", "Cuenta", "se ha creado."])
    assert placed is not None and "⟦0⟧cuenta⟦1⟧" in placed.text
    assert masking.SENTINEL.sub("", placed.text) == "Se ha creado la cuenta de usuario."


def test_words_nobody_claims_stay_outside_the_element() -> None:
    placed = place_markup("Click ⟦0⟧Cancel⟦1⟧ to close the window.",
                          "Klicken Sie auf Abbrechen, um das Fenster zu schließen.",
                          ["Klicken", "Abbrechen", "um das Fenster zu schließen."])
    assert placed is not None and placed.confident
    assert placed.text == "Klicken Sie auf ⟦0⟧Abbrechen⟦1⟧, um das Fenster zu schließen."


def test_the_tagged_translation_says_where_a_word_went_that_the_piece_alone_does_not_match() -> None:
    placed = place_markup("Click ⟦0⟧Cancel⟦1⟧ to close the window.",
                          "Klicken Sie auf Ankalität, um das Fenster zu schließen.",
                          ["Klicken", "Abbrechen", "um das Fenster zu schließen."],
                          ["Klicken Sie auf ", "Ankalität", ", um das Fenster schließen."])
    assert placed is not None and placed.text == "Klicken Sie auf ⟦0⟧Ankalität⟦1⟧, um das Fenster zu schließen."
    assert placed.matched == (True, True, True)


def test_chinese_is_cut_between_characters() -> None:
    placed = place_markup("Click ⟦0⟧here⟦1⟧ to open ⟦2⟧the file⟦3⟧.", "点击这里打开文件。", ["点击", "这里", "打开", "文件", None])
    assert placed is not None and placed.text == "点击⟦0⟧这里⟦1⟧打开⟦2⟧文件⟦3⟧。" and placed.confident


def test_nested_elements_keep_spaces_and_punctuation_outside() -> None:
    placed = place_markup("Internal data flow ⟦0⟧⟦1⟧error⟦2⟧⟦3⟧.", "Interner Datenfluss-Fehler.",
                          ["Interner Datenfluss", None, "Fehler", None, None])
    assert placed is not None and placed.text == "Interner Datenfluss-⟦0⟧⟦1⟧Fehler⟦2⟧⟦3⟧."
    placed = place_markup("The ⟦0⟧⟦1⟧screen where⟦2⟧⟦3⟧ this icon shows", "La pantalla donde este icono aparece",
                          ["La", None, "pantalla donde", None, "este icono aparece"])
    assert placed is not None and placed.text == "La ⟦0⟧⟦1⟧pantalla donde⟦2⟧⟦3⟧ este icono aparece"


def test_a_link_that_ends_the_segment_keeps_a_word() -> None:
    # A reader leaves the end tag of an element that closes the segment out of it: the last piece is the link's text.
    placed = place_markup("could not acquire SSPI ⟦0⟧credentials", "konnte SSPI-Anmeldedaten nicht abrufen",
                          ["konnte SSPI nicht erwerben", "Anmeldedaten"])
    assert placed is not None
    pieces = masking.split_at_sentinels(placed.text, 1)
    assert pieces is not None and pieces[1].strip()


def test_text_around_the_elements_may_empty_as_the_target_reorders() -> None:
    placed = place_markup("modifying ⟦0⟧server⟦1⟧ settings", "modifier les paramètres de serveur",
                          ["modifier", "serveur", "paramètres"], ["modifier les paramètres de ", "serveur", ""])
    assert placed is not None and placed.text == "modifier les paramètres de ⟦0⟧serveur⟦1⟧" and placed.confident


def test_a_placement_the_pieces_do_not_bear_out_is_not_confident() -> None:
    placed = place_markup("Your ⟦0⟧account⟦1⟧ has been created.", "Se ha creado la cuenta de usuario.",
                          ["Puede", "contrario", "se ha creado."])
    assert placed is not None and not placed.confident
    assert masking.split_at_sentinels(placed.text, 2) is not None


@pytest.mark.parametrize("translation", ["", "Guardar.", "…"])
def test_too_few_words_for_the_pieces_that_need_one(translation: str) -> None:
    assert place_markup("Click ⟦0⟧Save⟦1⟧ to keep ⟦2⟧changes⟦3⟧.", translation,
                        ["Pulse", "Guardar", "para mantener", "cambios", None]) is None


def test_a_long_paragraph_is_placed_quickly() -> None:
    import time

    words = " ".join(f"palabra{i}" for i in range(300))
    source = " ".join(f"word{i}" if i % 30 else f"⟦{i // 15}⟧word{i}⟦{i // 15 + 1}⟧" for i in range(300))
    pieces = masking.split_at_sentinels(source, masking.sentinel_count(source))
    assert pieces is not None
    started = time.perf_counter()
    placed = place_markup(source, words, [p.strip() or None for p in pieces])
    assert placed is not None and time.perf_counter() - started < 5.0


def test_a_guess_counts_only_where_nothing_else_of_the_piece_is_found_and_is_never_confident() -> None:
    # "account" alone is nonsense; the tagged translation wrote the word, then its emptied tags.
    placed = place_markup("Your ⟦0⟧account⟦1⟧ has been created.", "Se ha creado la cuenta de usuario.",
                          ["Puede", "contrario", "se ha creado."], ["Se ha creado la cuenta ", "", "."],
                          [None, "cuenta", None])
    assert placed is not None and placed.text == "Se ha creado la ⟦0⟧cuenta⟦1⟧ de usuario." and not placed.confident
    # The piece's own translation is in the sentence: the guess ("el", before the emptied tags) is not taken.
    placed = place_markup("Open the ⟦0⟧file⟦1⟧ now.", "Abre el archivo ahora.", ["Abre el", "archivo", "ahora."],
                          ["Abre el ", "", " archivo ahora."], [None, "el", None])
    assert placed is not None and placed.text == "Abre el ⟦0⟧archivo⟦1⟧ ahora." and placed.confident


def test_a_paragraph_of_hundreds_of_runs_goes_piece_by_piece_at_once() -> None:
    import time

    from hunyuan_mt.documents.alignment import MAX_WORK

    count = 600
    source = "".join(f"w{i}⟦{i}⟧" for i in range(count)) + "end"
    pieces = masking.split_at_sentinels(source, count)
    assert pieces is not None
    translation = " ".join(f"x{i}" for i in range(count + 1))
    started = time.perf_counter()
    assert place_markup(source, translation, list(pieces)) is None  # past MAX_WORK: the caller goes piece by piece
    assert time.perf_counter() - started < 1.0 and (2 * count + 1) * (count + 1) > MAX_WORK
