"""The Status tab's latency plot keeps short requests readable beside a long document: documents are left out of
its points and counted in its caption (one 60 s document flattened every other point)."""

from __future__ import annotations

import time

from hunyuan_mt.web.status_view import plots


def test_a_long_document_is_left_out_of_the_latency_plot_and_named_in_its_caption() -> None:
    now = time.time()
    history = [[now - 30, 48.0, 1.0, "text"], [now - 20, 61000.0, 1.0, "document"], [now - 10, 52.0, 1.0, "text"]]
    latency, _ = plots({"history": history})
    assert list(latency["value"]["latency_ms"]) == [48.0, 52.0]
    assert latency["y_lim"] == [0, 100.0]  # the axis fits the texts, not the document
    assert latency["caption"] == ("2 requests in the last 5 minutes; slowest 52 ms. 1 document left out of the "
                                  "plot, the longest 61.0 s.")
    only_documents, _ = plots({"history": [[now - 5, 3000.0, 1.0, "document"]]})
    assert only_documents["caption"] == ("No text requests in the last 5 minutes. 1 document left out of the plot, "
                                         "the longest 3.0 s.")


def test_the_status_overview_says_why_the_weights_run_as_they_do() -> None:
    """With model.quantization: auto the service picks float32 or int8 by this CPU's int8 GEMM; the status tab says
    which, and why (backbone info's quantization_note), and says nothing when the user's choice runs as asked."""
    from hunyuan_mt.web.status_view import overview_markdown

    backbone = {"name": "demo", "arch": "encoder-decoder", "device": "cpu", "dtype": "float32", "quantization": "none"}
    note = "auto: float32 (int8 through fbgemm takes 1.2× float32's time on this CPU (79 vs 66 µs, AVX2))"
    text = overview_markdown({"backbone": {**backbone, "quantization_note": note}})
    assert f"**Weights:** {note}" in text and "**quantization**" not in text
    assert "**Weights:**" not in overview_markdown({"backbone": backbone})
    int8 = overview_markdown({"backbone": {**backbone, "quantization": "int8", "int8_kernel": "fbgemm"}})
    assert "**quantization** int8 (fbgemm)" in int8
