"""Language detection on sample sentences and short strings (lingua + word model + script rules)."""

from __future__ import annotations

import threading

import pytest

from hunyuan_mt.text.detect import Detection, detect, get_detector

SENTENCES = {
    "en": "The weather is nice today, so we are going to the park.",
    "es": "El tiempo es agradable hoy, así que vamos al parque.",
    "de": "Das Wetter ist heute schön, deshalb gehen wir in den Park.",
    "fr": "Il fait beau aujourd'hui, alors nous allons au parc.",
    "zh": "今天天气很好，所以我们去公园。",
    "zh-Hant": "今天天氣很好，所以我們去公園。",
    "yue": "今日天氣好好，我哋去公園啦。",
    "ru": "Сегодня хорошая погода, поэтому мы идём в парк.",
    "ja": "今日は天気がいいので、公園に行きます。",
    "ko": "오늘은 날씨가 좋아서 공원에 갑니다.",
    "pt": "O tempo está bom hoje, então vamos ao parque.",
    "it": "Oggi il tempo è bello, quindi andiamo al parco.",
    "km": "ថ្ងៃនេះអាកាសធាតុល្អណាស់",
    "my": "ဒီနေ့ ရာသီဥတု ကောင်းတယ်",
    "bo": "དེ་རིང་གནམ་གཤིས་ཡག་པོ་འདུག",
    "ug": "بۈگۈن ھاۋا ناھايىتى ياخشى",
    "ar": "الطقس جميل اليوم، لذلك سنذهب إلى الحديقة.",
}

SHORT = {
    "Hello": "en", "Thank you": "en", "Save": "en", "Help": "en", "Good morning": "en",
    "Hola": "es", "Gracias": "es", "Ayuda": "es", "Buenos días": "es", "Sí": "es",
    "Danke": "de", "Hilfe": "de", "Guten Morgen": "de", "Nein": "de", "Datei öffnen": "de",
    "Bonjour": "fr", "Merci": "fr", "Le chat dort.": "fr", "Oui": "fr", "Ouvrir le fichier": "fr",
    "你好": "zh", "谢谢": "zh",
}


@pytest.mark.parametrize("code", sorted(SENTENCES))
def test_sentences_detected(code: str) -> None:
    best = detect(SENTENCES[code])[0]
    assert best.code == code
    assert 0 < best.confidence <= 1


@pytest.mark.parametrize("text", sorted(SHORT))
def test_short_strings_common_languages(text: str) -> None:
    assert detect(text)[0].code == SHORT[text]


def test_results_best_first_and_bounded() -> None:
    found = detect(SENTENCES["es"], top=5)
    assert len(found) <= 5
    assert all(isinstance(d, Detection) for d in found)
    assert [d.confidence for d in found] == sorted((d.confidence for d in found), reverse=True)
    assert sum(d.confidence for d in found) <= 1.0001


def test_among_restricts_candidates() -> None:
    # Portuguese text, but only es/en allowed: the closest allowed language wins, never a code outside the set.
    found = detect(SENTENCES["pt"], among={"es", "en"})
    assert {d.code for d in found} <= {"es", "en"}
    assert found[0].code == "es"
    assert detect(SENTENCES["zh-Hant"], among={"zh", "en"})[0].code == "zh"


@pytest.mark.parametrize("text", ["", "   ", "12345 678", "!!! ???", "🙂🙂"])
def test_no_letters_no_detection(text: str) -> None:
    assert detect(text) == []


def test_detector_built_once_under_concurrency() -> None:
    results: list[str] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        results.append(detect(SENTENCES["de"])[0].code)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["de"] * 8
    assert get_detector() is get_detector()
