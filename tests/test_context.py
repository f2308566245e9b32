"""A request's `context` (text that shapes the translation and is not itself translated) reaches a decoder-only
backbone's prompt as the HY-MT1.5 card's contextual template, on every hop; the family's plain templates are chosen
by the profile (`model.prompt`); over HTTP `/translate`, `/translate_file` and `/v1/documents` take it, charge it,
and refuse what they cannot take."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hunyuan_mt.runtime.backbone import Backbone, PromptRow
from hunyuan_mt.config import load_config
from hunyuan_mt.service.translation import TranslationService
from web_server import serve

CONTEXT = "The File menu of a text editor."


@pytest.fixture(scope="module")
def hy_service(hunyuan_dir: Path, hunyuan_adapters: Path):
    cfg = load_config(overrides={
        "model.path": str(hunyuan_dir), "model.warmup": False, "model.prompt": "hy-mt1.5",
        "cache.adapters_dir": str(hunyuan_adapters), "routing.pivot": "en", "memory.enabled": False,
        "limits.max_new_tokens": 8, "limits.max_chars": 300, "engine.max_wait_ms": 1, "model.quantization": "none",
        "server.host": "127.0.0.1", "server.port": 0,
        # The loop guard off: outputs compared with the backbone's own generate, which has none, must not depend
        # on whether the random model happens to repeat itself.
        "limits.loop_repeats": 0,
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
                       "\n\nOpen the file.</s>"]
    prompts.clear()
    shaped = service.translate("Open the file.", "en", "de", context=CONTEXT)
    assert prompts == [f"<s>user: {CONTEXT}\n参考上面的信息，把下面的文本翻译成德语，注意不需要翻译上文，也不要额外解释："
                       "\nOpen the file.</s>"]
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


def test_translate_over_http_takes_context_with_text_and_html(hy_service) -> None:
    service, prompts = hy_service
    with serve(service, service.cfg) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        prompts.clear()
        response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "de",
                                                   "context": CONTEXT})
        assert response.status_code == 200, response.text
        assert response.json()["translatedText"] == service.translate("Open the file.", "en", "de",
                                                                      context=CONTEXT).text
        assert CONTEXT in prompts[0]
        prompts.clear()
        html = client.post("/translate", json={"q": "<p>Open the file.</p>", "source": "en", "target": "de",
                                               "format": "html", "context": CONTEXT})
        assert html.status_code == 200, html.text
        assert html.json()["translatedText"] == f"<p>{response.json()['translatedText']}</p>"
        assert prompts and all(p.startswith(f"<s>user: {CONTEXT}\n参考上面的信息") for p in prompts)
        long = client.post("/translate", data={"q": "Open.", "source": "en", "target": "de", "context": "x" * 400})
        assert long.status_code == 413, long.text


def test_glossary_terms_go_into_the_terminology_prompt_and_stay_enforced(hy_service) -> None:
    """glossary.mode prompt: a direct route's segment lists its terms as the HY-MT1.5 card's terminology template
    (the source keeps its words); an output that lost a term is translated again with sentinels, so the answer
    holds it; a pivot route, whose first hop has no terms in the pivot language, takes the visible form."""
    from hunyuan_mt.text.glossary import Glossary

    service, prompts = hy_service
    service.cfg.glossary.mode = "prompt"
    glossary = Glossary((("file", "Datei"), ("window", "Fenster")))
    try:
        prompts.clear()
        result = service.translate("Open the file.", "en", "de", glossary=glossary)
        assert prompts[0] == ("<s>user: 参考下面的翻译：\nfile 翻译成 Datei\n\n将以下文本翻译为德语，注意只需要输出翻译后的结果，"
                              "不要额外解释：\nOpen the file.</s>")
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


def test_a_documents_context_reaches_every_segments_prompt_over_both_routes(hy_service) -> None:
    """`context` beside an upload: every segment's prompt holds it (the job route and LibreTranslate's file route),
    it is charged once, and one over the limit is refused before a job exists."""
    service, prompts = hy_service
    text = "Open the file.\n\nSave the changes.\n"
    files = {"file": ("notes.txt", text.encode(), "text/plain")}
    with serve(service, service.cfg) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        prompts.clear()
        submitted = client.post("/v1/documents", data={"source": "en", "target": "de", "context": CONTEXT},
                                files=files)
        assert submitted.status_code == 202, submitted.text
        job = client.get(f"/v1/documents/{submitted.json()['id']}", params={"wait": 30}).json()
        while job["state"] not in ("done", "error", "cancelled"):
            job = client.get(f"/v1/documents/{job['id']}", params={"wait": 30}).json()
        assert job["state"] == "done", job
        result = client.get(job["result_url"]).text
        segments = ["Open the file.", "Save the changes."]
        assert len(prompts) == 2 and all(p.startswith(f"<s>user: {CONTEXT}\n参考上面的信息") for p in prompts)
        assert [p.split("\n")[-1].split("</s>")[0] for p in prompts] == segments
        expected = [service.translate(s, "en", "de", context=CONTEXT).text for s in segments]
        assert result.split("\n\n")[0].strip() == expected[0] and expected[1] in result
        prompts.clear()
        done = client.post("/translate_file", data={"source": "en", "target": "de", "context": CONTEXT},
                           files=files)
        assert done.status_code == 200, done.text
        assert client.get(done.json()["translatedFileUrl"]).text == result
        assert len(prompts) == 2 and all(p.startswith(f"<s>user: {CONTEXT}\n参考上面的信息") for p in prompts)
        listed = client.get("/v1/documents").json()["jobs"]
        too_long = client.post("/v1/documents", data={"source": "en", "target": "de", "context": "x" * 301},
                               files=files)
        assert too_long.status_code == 413 and "Context is 301 characters" in too_long.json()["error"]
        assert len(client.get("/v1/documents").json()["jobs"]) == len(listed)     # no job was made


def test_the_page_takes_context_for_a_decoder_only_model_and_hides_it_for_the_demo(hy_service, web_service) -> None:
    """Through the page's public endpoint (gradio_client, as a script would call it) the context reaches the
    prompt; an encoder-decoder model (the demo) has no place for it, so its page shows no Context field."""
    from gradio_client import Client

    from hunyuan_mt.web.ui import TranslatorUI

    service, prompts = hy_service
    assert TranslatorUI(service, service.cfg).takes_context()
    assert not TranslatorUI(web_service, web_service.cfg).takes_context()
    with serve(service, service.cfg) as server:
        prompts.clear()
        page = Client(server.url + "/ui/", verbose=False)
        text, _info = page.predict("Open the file.", "en", "de", "", CONTEXT, api_name="/translate")
        assert text == service.translate("Open the file.", "en", "de", context=CONTEXT).text
        assert prompts[0].startswith(f"<s>user: {CONTEXT}\n参考上面的信息")
