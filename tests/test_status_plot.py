"""The Status tab's latency plot keeps short requests readable beside a long document: documents are left out of
its points and counted in its caption (issue 24: one 60 s document flattened every other point)."""

from __future__ import annotations

import time

from hunyuan_mt.web.ui import _plots


def test_a_long_document_is_left_out_of_the_latency_plot_and_named_in_its_caption() -> None:
    now = time.time()
    history = [[now - 30, 48.0, 1.0, "text"], [now - 20, 61000.0, 1.0, "document"], [now - 10, 52.0, 1.0, "text"]]
    latency, _ = _plots({"history": history})
    assert list(latency["value"]["latency_ms"]) == [48.0, 52.0]
    assert latency["y_lim"] == [0, 100.0]  # the axis fits the texts, not the document
    assert latency["caption"] == ("2 requests in the last 5 minutes; slowest 52 ms. 1 document left out of the "
                                  "plot, the longest 61.0 s.")
    only_documents, _ = _plots({"history": [[now - 5, 3000.0, 1.0, "document"]]})
    assert only_documents["caption"] == ("No text requests in the last 5 minutes. 1 document left out of the plot, "
                                         "the longest 3.0 s.")
