"""A request's `context` (text that shapes the translation and is not itself translated) reaches a decoder-only
backbone's prompt as the HY-MT1.5 card's contextual template, on every hop; the family's plain templates are chosen
by the profile (`model.prompt`); over HTTP `/translate` takes it, charges it, and refuses what it cannot take."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hunyuan_mt.backbone import Backbone, PromptRow
from hunyuan_mt.config import load_config
from hunyuan_mt.service import TranslationService
from web_server import serve

CONTEXT = "The File menu of a text editor."


@pytest.fixture(scope="module")
def hy_service(hunyuan_dir: Path, hunyuan_adapters: Path):
    cfg = load_config(overrides={
        "model.path": str(hunyuan_dir), "model.warmup": False, "model.prompt": "hy-mt1.5",
        "cache.adapters_dir": str(hunyuan_adapters), "routing.pivot": "en", "memory.enabled": False,
        "limits.max_new_tokens": 8, "limits.max_chars": 300, "engine.max_wait_ms": 1, "model.quantization": "none",
        "server.host": "127.0.0.1", "server.port": 0,
    }, env={})
    service = TranslationService(cfg, backbone=Backbone.load_uncached(cfg.model))
    prompts: list[str] = []
    encode = service.backbone.encode

    def spy(row: PromptRow):
        prompts.append(service.backbone.prompt_text(row))
        return encode(row)

    service.backbone.encode = spy
    yield service, prompts
    service.close()


def test_context_goes_into_every_hops_prompt_and_shapes_the_output(hy_service) -> None:
    service, prompts = hy_service
    prompts.clear()
    plain = service.translate("Open the file.", "en", "de")
    assert prompts == ["<s>user: Translate the following segment into German, without additional explanation."
                       "\n\nOpen the file.</s><s>assistant:"]
    prompts.clear()
    shaped = service.translate("Open the file.", "en", "de", context=CONTEXT)
    assert prompts == [f"<s>user: {CONTEXT}\n参考上面的信息，把下面的文本翻译成德语，注意不需要翻译上文，也不要额外解释："
                       "\nOpen the file.</s><s>assistant:"]
    with service.cache.lease([service.router.plan("en", "de").hops[0].adapter]) as lease:
        expected = service.backbone.generate([PromptRow("Open the file.", "en", "de", CONTEXT)], lease.slots,
                                             service.cfg.generation, 8)[0]
    assert shaped.text == expected and shaped.text != plain.text
    prompts.clear()
    pivot = service.translate("Abra el archivo.", "es", "de", context=CONTEXT)  # es → en → de
    assert pivot.route_kind == "pivot" and len(prompts) == 2
    assert all(p.startswith(f"<s>user: {CONTEXT}\n参考上面的信息") for p in prompts)


def test_context_is_checked_like_the_text(hy_service) -> None:
    from hunyuan_mt.errors import InputTooLarge, InvalidInput

    service, _ = hy_service
    with pytest.raises(InputTooLarge, match="Context is 301 characters, over the limit of 300"):
        service.translate("Open.", "en", "de", context="x" * 301)
    with pytest.raises(InvalidInput, match="Context must be a string"):
        service.translate("Open.", "en", "de", context=["not", "text"])
    assert service.clean_context(" \n ") is None
    assert service.clean_context("a\x00b ") == "ab"


def test_translate_over_http_takes_context_and_refuses_it_with_html(hy_service) -> None:
    service, prompts = hy_service
    with serve(service, service.cfg) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        prompts.clear()
        response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "de",
                                                   "context": CONTEXT})
        assert response.status_code == 200, response.text
        assert response.json()["translatedText"] == service.translate("Open the file.", "en", "de",
                                                                      context=CONTEXT).text
        assert CONTEXT in prompts[0]
        html = client.post("/translate", json={"q": "<p>Open</p>", "source": "en", "target": "de",
                                               "format": "html", "context": CONTEXT})
        assert html.status_code == 400 and "context is not supported with format html" in html.json()["error"]
        long = client.post("/translate", data={"q": "Open.", "source": "en", "target": "de", "context": "x" * 400})
        assert long.status_code == 413, long.text


def test_glossary_terms_go_into_the_terminology_prompt_and_stay_enforced(hy_service) -> None:
    """glossary.mode prompt: a direct route's segment lists its terms as the HY-MT1.5 card's terminology template
    (the source keeps its words); an output that lost a term is translated again with sentinels, so the answer
    holds it; a pivot route, whose first hop has no terms in the pivot language, takes the visible form."""
    from hunyuan_mt.glossary import Glossary

    service, prompts = hy_service
    service.cfg.glossary.mode = "prompt"
    glossary = Glossary((("file", "Datei"), ("window", "Fenster")))
    try:
        prompts.clear()
        result = service.translate("Open the file.", "en", "de", glossary=glossary)
        assert prompts[0] == ("<s>user: 参考下面的翻译：\nfile 翻译成 Datei\n\n将以下文本翻译为德语，注意只需要输出翻译后的结果，"
                              "不要额外解释：\nOpen the file.</s><s>assistant:")
        assert "Datei" in result.text and result.glossary_terms == 1
        assert len(prompts) == 1 or "file" not in prompts[1]  # the second run, if any, carries a sentinel
        prompts.clear()
        both = service.translate("Close the window.", "en", "de", glossary=glossary, context=CONTEXT)
        assert prompts[0].startswith("<s>user: 参考下面的翻译：\nwindow 翻译成 Fenster\n\n" + CONTEXT + "\n参考上面的信息")
        assert "Fenster" in both.text
        prompts.clear()
        service.translate("Abra el archivo.", "es", "de", glossary=Glossary((("archivo", "Datei"),)))
        assert not any("参考下面的翻译" in p for p in prompts) and "Datei" in prompts[0]  # pivot: visible
    finally:
        service.cfg.glossary.mode = "visible"
