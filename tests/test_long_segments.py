"""Long segments never fail a document or a text: a segment over what the model can take is cut at its
best boundary (clause, comma, space), and a run with no boundary (a checksum, a base64 key, 300 letters without a
space) comes back unchanged. Each of these was refused with 413 before, for the whole document. And the link to a
translated document is percent-encoded, so curl and urllib fetch it whatever the file's name."""

from __future__ import annotations

import base64
import hashlib
import random
from typing import Iterator

import httpx
import pytest

from hunyuan_mt.text.segment import split_text
from web_server import LiveServer

MD5S = " ".join(hashlib.md5(str(i).encode()).hexdigest() for i in range(12))
KEY = base64.b64encode(random.Random(7).randbytes(300)).decode()
NAMES = ", ".join(f"{first} {last}" for first, last in zip(
    ["Anna", "Bruno", "Carla", "Dario", "Elena", "Fabio", "Greta", "Hugo", "Irene", "Jonas"] * 12,
    ["Rossi", "Meyer", "Dubois", "Garcia", "Novak", "Berg", "Costa", "Laine", "Moreau", "Silva"] * 12))


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=300) as c:
        yield c


def _document(client: httpx.Client, name: str, body: str) -> str:
    response = client.post("/translate_file", files={"file": (name, body.encode(), "text/plain")},
                           data={"source": "en", "target": "es"})
    assert response.status_code == 200, response.text
    return httpx.get(response.json()["translatedFileUrl"], timeout=60).text


def test_a_line_of_checksums_passes_through_a_text_file(client: httpx.Client) -> None:
    out = _document(client, "sums.txt", f"Checksums of the release files:\n{MD5S}\n")
    assert MD5S in out


def test_a_base64_key_passes_through_a_markdown_file(client: httpx.Client) -> None:
    out = _document(client, "key.md", f"# Keys\n\nYour key is {KEY}\n\nKeep it secret.\n")
    assert KEY in out


def test_a_list_of_120_names_is_cut_at_commas_and_translated(client: httpx.Client) -> None:
    out = _document(client, "guests.txt", f"The guests are {NAMES}.\n")
    assert out.strip() and out.count(",") >= 60


def test_translate_of_300_characters_without_a_space_comes_back_unchanged(client: httpx.Client) -> None:
    text = "x" * 150 + "y" * 150
    response = client.post("/translate", json={"q": text, "source": "en", "target": "es"})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == text


def test_splitting_cuts_at_the_best_boundary_nearest_the_middle() -> None:
    fits = lambda s: len(s) <= 30  # noqa: E731 - a model limit of 30 characters
    clause = split_text("First part of it; second part of it, and the rest of the sentence.", "en", fits=fits)
    assert clause.segments == ["First part of it;", "second part of it,", "and the rest of the sentence."]
    opaque = "a1" * 40
    seg = split_text(f"Key {opaque} here", "en", fits=fits)
    assert seg.segments == ["Key", opaque, "here"] and seg.render(seg.segments) == f"Key {opaque} here"


def test_download_links_are_percent_encoded_for_curl_and_urllib(client: httpx.Client) -> None:
    import subprocess
    import urllib.request

    name = "my report (final) ñ 中文 ✓.txt"
    response = client.post("/translate_file", files={"file": (name, b"Unknown error\n", "text/plain")},
                           data={"source": "en", "target": "es"})
    url = response.json()["translatedFileUrl"]
    assert " " not in url and url.isascii(), url
    with urllib.request.urlopen(url, timeout=60) as fetched:
        body = fetched.read().decode()
        assert "filename*=UTF-8''" in fetched.headers["content-disposition"]
    curl = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url], capture_output=True,
                          text=True, timeout=60)
    assert curl.stdout == "200" and body.strip()
