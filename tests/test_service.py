"""The service facade over tiny models: routes reported, validation errors, layout, masking, prompts, status."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import Backbone, PromptRow
from hunyuan_mt.config import load_config
from hunyuan_mt.scheduler.engine import Row
from hunyuan_mt.errors import InputTooLarge, InvalidInput, UnreachablePair, UnsupportedLanguage
from hunyuan_mt.service.translation import TranslationResult, TranslationService


def make_service(model_dir: Path, adapters: Path, **overrides) -> TranslationService:
    cfg = load_config(overrides={
        "model.path": str(model_dir), "model.warmup": False, "cache.adapters_dir": str(adapters),
        "cache.pinned": ["en2es"], "routing.pivot": "en", "memory.enabled": False,
        "limits.max_new_tokens": 8, "limits.max_chars": 300, "limits.max_batch_items": 4,
        "engine.max_wait_ms": 1,
        # float32: these tests compare outputs with references computed apart (PEFT, a row alone); the int8 profile
        # is served end to end by the web tests and checked in tests/test_lean_step.py.
        "model.quantization": "none", **overrides,
    }, env={})
    return TranslationService(cfg, backbone=Backbone.load_uncached(cfg.model))


@pytest.fixture(scope="module")
def svc(marian_dir: Path, marian_adapters: Path):
    service = make_service(marian_dir, marian_adapters)
    yield service
    service.close()


@pytest.fixture(scope="module")
def hsvc(hunyuan_dir: Path, hunyuan_adapters: Path):
    service = make_service(hunyuan_dir, hunyuan_adapters)
    yield service
    service.close()


def one(service: TranslationService, text: str, key: str) -> str:
    pair = Pair.parse(key)
    return service.engine.run([Row(text, pair.src, pair.tgt, pair)])[0]


def test_direct_route(svc: TranslationService) -> None:
    res = svc.translate("Hello world, how are you today?", "en", "es")
    assert isinstance(res, TranslationResult)
    assert res.text == one(svc, "Hello world, how are you today?", "en2es")
    assert (res.source, res.target, res.route, res.route_kind, res.adapters) == ("en", "es", ["en", "es"], "direct",
                                                                                 ["en2es"])
    assert res.route_label == "en → es (direct)"
    assert res.detected is None and res.timings_ms["total"] > 0


def test_pivot_route_taken_and_reported(svc: TranslationService) -> None:
    text = "Hola mundo, como estas hoy?"
    res = svc.translate(text, "es", "de")
    assert res.route == ["es", "en", "de"] and res.route_kind == "pivot"
    assert res.adapters == ["es2en", "en2de"]
    assert res.route_label == "es → en → de (pivot)"
    assert res.text == one(svc, one(svc, text, "es2en"), "en2de")


def test_same_language_passthrough(svc: TranslationService) -> None:
    text = "  Hello,\n\n  world!\t"
    before = svc.engine.stats.rows
    res = svc.translate(text, "en", "EN")
    assert res.text == text and res.route_kind == "identity" and res.adapters == [] and res.route == ["en"]
    assert svc.engine.stats.rows == before  # the model was not called


def test_unknown_code_clear_error(svc: TranslationService) -> None:
    with pytest.raises(UnsupportedLanguage, match=r"^Unsupported language code 'xyz'\. Codes this server translates: zh, en,"):
        svc.translate("Hello", "en", "xyz")
    with pytest.raises(UnsupportedLanguage, match=r"^Malformed language code '\.\./\.\./etc'"):
        svc.translate("Hello", "../../etc", "es")
    with pytest.raises(UnsupportedLanguage, match="^Missing target language code"):
        svc.translate("Hello", "en", "")


def test_unreachable_pair(svc: TranslationService) -> None:
    with pytest.raises(UnreachablePair) as info:
        svc.translate("Bonjour", "fr", "ja")
    assert "Reachable from fr: zh, en, es, de." in info.value.message


def test_auto_detect(svc: TranslationService) -> None:
    res = svc.translate("El tiempo es agradable hoy, así que vamos al parque.", "auto", "en")
    assert res.detected is not None and res.detected.code == "es" and res.source == "es"
    assert res.route == ["es", "en"] and "detect" in res.timings_ms
    assert svc.translate("Guten Morgen, wie geht es dir?", "auto", "en").source == "de"
    assert svc.translate("今天天气很好。", "auto", "en").source == "zh"
    with pytest.raises(InvalidInput, match="^Could not detect the language"):
        svc.translate("12345 !!!", "auto", "en")
    # Clearly a language no adapter serves: say so, do not translate it as the nearest served language.
    with pytest.raises(UnreachablePair, match="^No route from ja to en"):
        svc.translate("今日は天気がいいので、公園に行きます。", "auto", "en")
    # Short and ambiguous among all languages, but the adapters' languages decide it.
    assert svc.translate("Hola", "auto", "en").source == "es"


@pytest.mark.parametrize("text,error,message", [
    ("", InvalidInput, "Text is empty."),
    ("   \n\t ", InvalidInput, "Text is empty (only whitespace or control characters)."),
    ("\x00\x01 \x7f", InvalidInput, "Text is empty (only whitespace or control characters)."),
    ("x" * 301, InputTooLarge, "Text is 301 characters, over the limit of 300 (limits.max_chars)."),
    (None, InvalidInput, "Text must be a string, got NoneType."),
])
def test_input_validation(svc: TranslationService, text, error, message: str) -> None:
    with pytest.raises(error) as info:
        svc.translate(text, "en", "es")
    assert info.value.message == message


def test_batch_limits(svc: TranslationService) -> None:
    with pytest.raises(InputTooLarge) as info:
        svc.translate_batch(["a"] * 5, "en", "es")
    assert info.value.message == "Batch has 5 texts, over the limit of 4 (limits.max_batch_items)."
    with pytest.raises(InvalidInput, match="^Batch is empty"):
        svc.translate_batch([], "en", "es")


def test_control_chars_stripped_and_surrogates_replaced(svc: TranslationService) -> None:
    assert svc.translate("Hel\x00lo wor\x07ld.", "en", "es").text == svc.translate("Hello world.", "en", "es").text
    res = svc.translate("Hello \ud800 world.", "en", "es")
    res.text.encode("utf-8")  # no lone surrogate can reach the caller
    assert svc.clean_text("a\ud800b") == "a\ufffdb"


def test_sentences_split_and_layout_kept(svc: TranslationService) -> None:
    text = "  Hello world.  How are you?\n\nOpen the file.\n"
    res = svc.translate(text, "en", "es")
    a, b, c = (one(svc, s, "en2es") for s in ("Hello world.", "How are you?", "Open the file."))
    assert res.text == f"  {a}  {b}\n\n{c}\n"


def test_masked_spans_survive(svc: TranslationService) -> None:
    res = svc.translate("Open https://example.com/a?b=1 and mail ana@example.org now.", "en", "es")
    assert "https://example.com/a?b=1" in res.text and "ana@example.org" in res.text
    # A segment that is only protected spans is not sent to the model at all.
    before = svc.engine.stats.rows
    assert svc.translate("https://example.com 42", "en", "es").text == "https://example.com 42"
    assert svc.engine.stats.rows == before


def test_alternatives_are_the_beam_searchs_other_outputs(svc: TranslationService, marian_dir: Path,
                                                         marian_adapters: Path) -> None:
    """`alternatives=n`: the main translation is the plain one; the alternatives are, in order, the outputs of a
    beam search with n+1 beams (run here through PEFT and transformers, apart from the server's slot layers) that
    differ from it."""
    from peft import PeftModel

    from hunyuan_mt.config import GenerationConfig, ModelConfig

    text = "Hello world, how are you today?"
    plain = svc.translate(text, "en", "es")
    res = svc.translate_batch([text], "en", "es", alternatives=2)[0]
    assert res.text == plain.text
    ref_bb = Backbone.load_uncached(ModelConfig(path=str(marian_dir), warmup=False))
    ref_bb.model = PeftModel.from_pretrained(ref_bb.model, marian_adapters / "en2es")
    encoded = ref_bb.encode(PromptRow(text, "en", "es"))
    beams = ref_bb._hf_generate([encoded], [0], GenerationConfig(num_beams=3), ref_bb.max_new_tokens(encoded, 8),
                                num_return_sequences=3)
    expected = [b for b in dict.fromkeys(beams) if b != plain.text][:2]
    assert expected and res.alternatives == expected
    assert plain.alternatives == []


def test_alternatives_on_a_pivot_vary_the_last_hop(svc: TranslationService) -> None:
    text = "Hola mundo, como estas hoy?"
    plain = svc.translate(text, "es", "de")
    res = svc.translate_batch([text], "es", "de", alternatives=3)[0]
    assert res.route_kind == "pivot" and res.text == plain.text
    middle = one(svc, text, "es2en")
    assert res.alternatives == [h for h in dict.fromkeys(svc.engine.run([Row(middle, "en", "de", Pair("en", "de"),
                                                                             n_best=4)])[0])
                                if h != plain.text][:3]


def test_alternatives_of_a_text_put_each_sentences_kth_output_in_place() -> None:
    from hunyuan_mt.text.segment import split_text
    from hunyuan_mt.service.results import TextJob, alternatives_of

    layout = split_text("One. Two.\nThree.", "en")
    job = TextJob(plan=None, layout=layout, protected=[None] * 3, current=["Uno.", "Dos.", "Tres."], todo=[0, 1, 2],
               nbest={0: ["Uno.", "Un.", "Uno!", "Un."], 1: ["Dos.", "Dos!"], 2: ["Tres."]})
    assert alternatives_of(job, 3) == ["Un. Dos!\nTres.", "Uno! Dos.\nTres."]
    assert alternatives_of(job, 1) == ["Un. Dos!\nTres."]
    assert alternatives_of(job, 0) == []


@pytest.mark.parametrize("value", [-1, 4, True, 1.5, "2"])
def test_alternatives_out_of_range_are_refused(svc: TranslationService, value) -> None:
    with pytest.raises(InvalidInput, match="alternatives"):
        svc.translate_batch(["Hello"], "en", "es", alternatives=value)


def test_batch_equals_singles(svc: TranslationService) -> None:
    texts = ["Hello world.", "Open the file.", "The quick brown fox."]
    batch = svc.translate_batch(texts, "en", "de")
    assert [r.text for r in batch] == [svc.translate(t, "en", "de").text for t in texts]
    assert all(r.adapters == ["en2de"] for r in batch)


def test_concurrent_requests_identical(svc: TranslationService) -> None:
    jobs = [("Hello world.", "en", "es"), ("Hola mundo.", "es", "de"), ("Open the file.", "en", "fr"),
            ("Datei öffnen.", "de", "en")] * 4
    ref = {j: svc.translate(*j).text for j in set(jobs)}
    got: dict[int, str] = {}
    barrier = threading.Barrier(len(jobs))

    def worker(i: int) -> None:
        barrier.wait()
        got[i] = svc.translate(*jobs[i]).text

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [got[i] for i in range(len(jobs))] == [ref[j] for j in jobs]


def test_translate_segments_progress(svc: TranslationService) -> None:
    calls: list[tuple[int, int]] = []
    segments = ["Hello world.", "  ", "Open the file. Save it.", ""]
    out = svc.translate_segments(segments, "en", "es", progress=lambda d, t: calls.append((d, t)))
    assert out[1] == "  " and out[3] == ""
    assert out[0] == svc.translate("Hello world.", "en", "es").text
    assert out[2] == svc.translate("Open the file. Save it.", "en", "es").text
    assert calls[0] == (0, 2) and calls[-1] == (2, 2)


def test_languages_and_status(svc: TranslationService) -> None:
    langs = {l.code: l for l in svc.languages()}
    assert len(langs) == 38
    assert langs["en"].targets == ["zh", "fr", "es", "de"] and langs["en"].native == "English"
    svc.translate("Hello world.", "en", "es")
    status = svc.status()
    json.dumps(status)
    assert status["backbone"]["arch"] == "encoder-decoder" and status["backbone"]["params"] > 0
    assert status["memory"]["mode"] == "normal" and status["memory"]["rss_bytes"] > 0
    assert status["memory"]["gpu"] is None
    assert "en2es" in {r["key"] for r in status["cache"]["resident"]}
    assert status["latency"]["count"] >= 1 and status["latency"]["p50_ms"] > 0
    t, ms, hit, kind = status["history"][-1]
    assert t > 0 and ms > 0 and 0 <= hit <= 1 and kind == "text"
    assert status["engine"]["batches"] >= 1


def test_decoder_only_prompt_format(hsvc: TranslationService) -> None:
    bb = hsvc.backbone
    assert bb.arch == "decoder-only"
    zh = bb.prompt_text(PromptRow("你好世界", "zh", "en"))
    assert zh == "<s>user: 把下面的文本翻译成英语，不要额外解释。\n\n你好世界</s>"  # the card passes add_generation_prompt=False
    en = bb.prompt_text(PromptRow("Hello world", "en", "es"))
    assert en == ("<s>user: Translate the following segment into Spanish, without additional explanation."
                  "\n\nHello world</s>")
    to_zh = bb.prompt_text(PromptRow("Hello", "en", "zh-Hant"))
    assert "把下面的文本翻译成繁体中文，不要额外解释。" in to_zh


def test_decoder_only_service_routes(hsvc: TranslationService) -> None:
    res = hsvc.translate("Hola mundo.", "es", "de")
    assert res.route_kind == "pivot" and res.adapters == ["es2en", "en2de"]
    assert res.text == one(hsvc, one(hsvc, "Hola mundo.", "es2en"), "en2de")
    assert hsvc.translate("Hello world.", "en", "zh").text == one(hsvc, "Hello world.", "en2zh")


def test_get_service_is_process_wide(marian_dir: Path, marian_adapters: Path, monkeypatch) -> None:
    import hunyuan_mt.service.translation as service_mod

    monkeypatch.setattr(service_mod, "_service", None)
    cfg = load_config(overrides={"model.path": str(marian_dir), "model.warmup": False,
                                 "cache.adapters_dir": str(marian_adapters), "cache.pinned": [],
                                 "memory.enabled": False}, env={})
    built: list[TranslationService] = []
    real_init = TranslationService.__init__

    def counting_init(self, cfg, backbone=None):
        built.append(self)
        real_init(self, cfg, backbone=Backbone.load_uncached(cfg.model))

    monkeypatch.setattr(TranslationService, "__init__", counting_init)
    results: list[TranslationService] = []
    threads = [threading.Thread(target=lambda: results.append(service_mod.get_service(cfg))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(built) == 1 and all(r is built[0] for r in results)
        assert service_mod.get_service() is built[0]
    finally:
        built[0].close()


def test_ready_only_after_the_first_request_of_every_kind_ran(marian_dir: Path, marian_adapters: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With warm-up on, the service is ready only once warmup.py has run detection, every pinned pair and a pivot
    route through pinned adapters (de → en → es here); its requests stay out of the counts."""
    import hunyuan_mt.service.translation as service_mod

    release = threading.Event()
    real = service_mod.warm_service

    def held(service: TranslationService):
        release.wait(60)
        return real(service)

    monkeypatch.setattr(service_mod, "warm_service", held)
    service = make_service(marian_dir, marian_adapters, **{"model.warmup": True, "model.compile": "off",
                                                           "cache.pinned": ["de2en", "en2es"]})
    import gc

    gc.unfreeze()  # an earlier test's service may have frozen what was alive then
    try:
        assert not service.ready and service.status()["ready"] is False
        release.set()
        assert service.wait_ready(120) and service.ready
        # What was alive after the warm-up is left out of the cycle collector's walks from then on.
        assert gc.get_freeze_count() > 1000
        report = service.warmup
        assert report is not None and report.ran[0] == "memories of 8 pairs"
        assert report.ran[1:] == ["detection", "de2en", "en2es", "stream de2en", "pivot de2en+en2es"], report
        assert report.skipped == [] and report.seconds > 0
        assert service.status()["counts"]["requests"] == 0
        assert service.status()["warmup"]["ran"] == report.ran
    finally:
        service.close()


def test_closing_during_warm_up_is_no_failure(marian_dir: Path, marian_adapters: Path,
                                              monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
                                              ) -> None:
    """Ctrl+C while the warm-up still runs: its requests then fail because the engine is gone, which is the stop
    the user asked for, not a warm-up bug worth a traceback."""
    import logging

    import hunyuan_mt.service.translation as service_mod

    release, finished = threading.Event(), threading.Event()
    real = service_mod.warm_service

    def held(service: TranslationService):
        release.wait(60)
        try:
            return real(service)
        finally:
            finished.set()

    monkeypatch.setattr(service_mod, "warm_service", held)
    service = make_service(marian_dir, marian_adapters, **{"model.warmup": True, "model.compile": "off",
                                                           "cache.pinned": ["en2es"]})
    with caplog.at_level(logging.INFO, logger="hunyuan_mt.service.translation"):
        service.close()
        release.set()
        assert finished.wait(60) and service._warm.wait(60)
    records = [r for r in caplog.records if r.name == "hunyuan_mt.service.translation" and "warm-up" in r.getMessage()]
    assert records and all(r.levelno == logging.INFO for r in records), [r.getMessage() for r in records]
    assert records[-1].getMessage().startswith("warm-up stopped: the service is closing")


def test_warm_up_says_why_a_kind_was_not_warmed(marian_dir: Path, marian_adapters: Path) -> None:
    from hunyuan_mt.service.warmup import warm_service

    service = make_service(marian_dir, marian_adapters, **{"cache.pinned": ["en2es"], "tm.enabled": False})
    try:
        report = warm_service(service)
        assert report.ran == ["detection", "en2es", "stream en2es"]
        assert report.skipped == ["pivot (no pivot route runs on pinned adapters only; a pivot route's first "
                                  "request loads its unpinned adapter)"]
        assert report.line().startswith("first request of every kind served in ")
        assert list(service.cache.lru_order()) == []  # nothing unpinned was loaded to warm up
    finally:
        service.close()


def test_a_service_that_does_not_detect_never_starts_the_detector_and_says_so(
        marian_dir: Path, marian_adapters: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """routing.detect: false (serve-ray's hot groups, whose detections the long tail makes): no detector helper is
    started, the warm-up runs without it, and a source of "auto" is refused in one sentence instead of loading it."""
    import hunyuan_mt.service.translation as service_mod
    from hunyuan_mt.text import detect

    started: list[int] = []
    monkeypatch.setattr(service_mod, "start_detector", lambda: started.append(1))
    monkeypatch.setattr(detect, "warm", lambda timeout=None: started.append(2))
    service = make_service(marian_dir, marian_adapters, **{"model.warmup": True, "model.compile": "off",
                                                           "routing.detect": False, "cache.pinned": ["en2es"]})
    try:
        assert service.wait_ready(120)
        assert started == []
        assert service.warmup is not None and "detection" not in service.warmup.ran
        assert service.warmup.ran[1:] == ["en2es", "stream en2es"], service.warmup
        refusal = "Language detection is off on this server (routing.detect: false); give the source language."
        with pytest.raises(InvalidInput, match=re.escape(refusal)):
            service.resolve_source("Hola amigo", "auto")
        with pytest.raises(InvalidInput, match=re.escape(refusal)):
            service.detect("Hola amigo")
        assert service.resolve_source("Hola amigo", "es") == ("es", None)
    finally:
        service.close()
