"""Downloads keep their names (`filename*` as RFC 5987 writes it, and an ASCII `filename` that spells the name
rather than dropping its letters: `curl -OJ` saved `Größe Übersicht.docx` as `Groe Ubersicht.de.docx`), and
answer HEAD as they answer GET."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from hunyuan_mt.web.downloads import ascii_name, attachment
from web_server import ADMIN_KEY, LiveServer


@pytest.mark.parametrize("name, plain", [
    ("Größe Übersicht.de.docx", "Grosse Ubersicht.de.docx"),
    ("Résumé notes.es.txt", "Resume notes.es.txt"),
    ("Œuvre ﬁnale.fr.pdf", "OEuvre finale.fr.pdf"),
    ("Łódź plan.pl.txt", "Lodz plan.pl.txt"),
    ("文档.es.docx", "document.es.docx"),         # another script: a name of its own, the rest kept
    ("Отчёт 2024.en.docx", "document.en.docx"),
    ('say "hi".txt', "say _hi_.txt"),
])
def test_the_plain_filename_spells_the_name_in_ascii(name: str, plain: str) -> None:
    header = attachment(name)
    assert f'filename="{plain}"' in header
    assert plain.isascii()


def test_filename_star_is_rfc_5987() -> None:
    header = attachment("Größe Übersicht (v2) #1.de.docx")
    encoded = header.split("filename*=", 1)[1]
    assert encoded == "UTF-8''Gr%C3%B6%C3%9Fe%20%C3%9Cbersicht%20%28v2%29%20#1.de.docx"
    # Only RFC 5987's attr-chars stand unencoded.
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$&+-.^_`|~%")
    assert set(encoded.split("''", 1)[1]) <= allowed
    assert ascii_name("Straße") == "Strasse" and ascii_name("中文") == ""


@pytest.fixture()
def client(live_server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=live_server.url, timeout=120) as c:
        yield c


def _job_result(client: httpx.Client, name: str, target: str) -> str:
    files = {"file": (name, b"Open the file.", "text/plain")}
    view = client.post("/v1/documents", data={"source": "en", "target": target}, files=files).json()
    done = client.get(f"/v1/documents/{view['id']}", params={"wait": 30}).json()
    while done["state"] not in ("done", "error", "cancelled"):
        done = client.get(f"/v1/documents/{view['id']}", params={"wait": 30}).json()
    assert done["state"] == "done", done
    return done["result_url"]


def test_curl_keeps_the_letters_of_a_german_name(client: httpx.Client, live_server: LiveServer,
                                                 tmp_path: Path) -> None:
    target = "de" if "de" in live_server.service.router.reachable_targets("en") else "es"
    url = _job_result(client, "Größe Übersicht.txt", target)
    subprocess.run(["curl", "-sS", "-f", "-O", "-J", url], cwd=tmp_path, check=True, timeout=60)
    assert [p.name for p in tmp_path.iterdir()] == [f"Grosse Ubersicht.{target}.txt"]


def test_head_on_the_download_routes_answers_as_get_does(client: httpx.Client) -> None:
    url = _job_result(client, "notes.txt", "es")
    got = client.get(url)
    head = client.head(url)
    assert head.status_code == got.status_code == 200
    assert head.content == b""
    for name in ("content-type", "content-disposition", "content-length"):
        assert head.headers[name] == got.headers[name]
    # The LibreTranslate download link of /translate_file.
    files = {"file": ("notes.txt", b"Open the file.", "text/plain")}
    link = client.post("/translate_file", data={"source": "en", "target": "es"}, files=files).json()
    head = client.head(link["translatedFileUrl"])
    assert head.status_code == 200 and head.content == b"" and "notes.es.txt" in head.headers["content-disposition"]
    # A missing one answers 404 to both.
    assert client.head(link["translatedFileUrl"].replace("notes", "other")).status_code == 404
    # The memory export, with the admin key only.
    assert client.head("/admin/memory", params={"pair": "en2es"}).status_code == 403
    head = client.head("/admin/memory", params={"pair": "en2es"}, headers={"X-Admin-Key": ADMIN_KEY})
    assert head.status_code == 200 and 'filename="en2es.tmx"' in head.headers["content-disposition"]


def test_a_downloaded_link_takes_no_share_and_makes_room_first() -> None:
    """A client translating files one after another (upload, download, next) is never refused; one that leaves its
    links waiting is, at its share; and a caller that downloads all it uploads cannot push out another's link that
    is still waiting, however many files it sends."""
    from hunyuan_mt.errors import RateLimited
    from hunyuan_mt.web.downloads import DownloadStore

    now = [0.0]
    store = DownloadStore(ttl_s=900, max_files=4, clock=lambda: now[0], per_caller=2)
    waiting = store.put(b"k1", "a.txt", "text/plain", caller="k1")
    for i in range(10):  # k2: upload, download, next
        store.check_quota("k2")
        store.taken(store.put(b"k2", f"{i}.txt", "text/plain", caller="k2"))
        now[0] += 1
    assert store.get(waiting) is not None and len(store) == 4
    store.put(b"k2", "x.txt", "text/plain", caller="k2")
    store.put(b"k2", "y.txt", "text/plain", caller="k2")
    with pytest.raises(RateLimited, match="2 translated files waiting to be downloaded"):
        store.check_quota("k2")  # two links waiting: its share
    assert store.get(waiting) is not None  # the downloaded files made the room
    store.check_quota("k1")


def test_a_get_takes_a_link_and_a_head_does_not(client: httpx.Client, live_server: LiveServer) -> None:
    store = live_server.app.state.api.downloads
    files = {"file": ("notes.txt", b"Open the file.", "text/plain")}
    url = client.post("/translate_file", data={"source": "en", "target": "es"}, files=files).json()[
        "translatedFileUrl"]
    token = url.split("/download_file/")[1].split("/")[0]
    assert client.head(url).status_code == 200 and token not in store._downloaded
    assert client.get(url).status_code == 200 and token in store._downloaded
