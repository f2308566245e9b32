"""Debian packages that carry the demo's bilingual data, fetched and unpacked without installing them.

`apt-get download` needs no root and no dpkg lock, and `dpkg -x` unpacks a package into a folder of our own, so
the build never changes the machine's installed software. Each group lands in its own folder under the data root.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

#: group → the packages whose files the readers in `sources` look for.
GROUPS: dict[str, tuple[str, ...]] = {
    "freedict": ("dict-freedict-eng-spa", "dict-freedict-eng-fra", "dict-freedict-eng-deu"),
    "libreoffice": (
        "libreoffice-l10n-es", "libreoffice-l10n-de", "libreoffice-l10n-fr", "libreoffice-l10n-zh-cn",
        "libreoffice-help-en-us", "libreoffice-help-es", "libreoffice-help-de", "libreoffice-help-fr",
        "libreoffice-help-zh-cn",
    ),
    "apps": (
        "inkscape", "gimp-data",
        "plasma-workspace-data", "plasma-desktop-data", "kwin-data", "kate5-data", "dolphin", "konsole", "okular",
        "gwenview", "kio", "systemsettings",
        "nautilus-data", "gnome-control-center-data", "evince-common", "gedit-common",
    ),
    # Documentation translated paragraph by paragraph (the paragraph data).
    "docs": ("gnome-user-docs",),
    # Translated manual pages, and the packages whose English pages they translate (a page without its English
    # original is not read; the list covers the commands and C library pages the translations cover most).
    "manpages": (
        "manpages-es", "manpages-de", "manpages-fr", "manpages-zh",
        "manpages", "manpages-dev", "coreutils", "util-linux", "findutils", "grep", "sed", "tar", "gzip", "bzip2",
        "xz-utils", "bash", "dpkg", "apt", "man-db", "procps", "psmisc", "passwd", "login", "mount", "less",
        "diffutils", "e2fsprogs", "kmod", "cron", "debianutils", "sysvinit-utils", "bsdutils", "hostname",
        "iputils-ping", "net-tools", "iproute2", "openssh-client", "rsync", "wget", "curl", "sudo", "nano", "time",
        "gawk", "file", "patch", "make", "cpio", "zip", "unzip", "lsof", "strace", "gettext-base",
    ),
    # HTML manuals translated block by block (more paragraph data, Chinese above all).
    "manuals": (
        "debian-reference-en", "debian-reference-es", "debian-reference-de", "debian-reference-fr",
        "debian-reference-zh-cn", "gimp-help-en", "gimp-help-es", "gimp-help-de", "gimp-help-fr", "gimp-help-zh-cn",
    ),
}


#: Desktop applications whose UI catalogues no build reads (bench.fresh_ui): strings no build has trained on, to
#: compare builds trained on different extractions. Not a build group: `fetch` never downloads them.
FRESH: tuple[str, ...] = (
    "gnome-calculator", "gnome-text-editor", "totem-common", "rhythmbox-data", "eog", "file-roller",
    "gnome-disk-utility", "baobab", "gnome-system-monitor", "gnome-terminal-data", "gnome-maps", "gnome-weather",
    "gnome-clocks", "simple-scan", "seahorse", "gnome-screenshot", "transmission-common", "gparted-common", "synaptic",
    "meld", "geany-common", "thunar-data", "mousepad", "ristretto", "xfce4-panel", "xfce4-settings", "vlc-l10n",
    "audacity-data", "filezilla-common", "ark", "kcalc", "gnucash-common", "pavucontrol", "remmina-common",
    "shotwell-common", "gnome-software-common", "evolution-common",
)


def unpack_group(group: str, data_root: Path, names: tuple[str, ...] | None = None) -> Path:
    """The folder holding the group's unpacked packages (`names`, default the group's in GROUPS); downloads and
    unpacks them on the first call. A group that cannot be fetched (no network, a package gone from the mirror) is
    reported and left empty: the build goes on with the sources it has, and the adapters' metadata lists only
    those."""
    names = names or GROUPS[group]
    target = data_root / group
    done = target / ".unpacked"
    if done.exists():
        return target
    debs = data_root / "debs" / group
    debs.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["apt-get", "download", *names], cwd=debs, check=True, capture_output=True)
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(target)], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        print(f"{group}: packages not available ({exc}; {detail.decode(errors='replace').strip()[:200]}); "
              "building without them")
        return target
    done.write_text("\n".join(names) + "\n", encoding="utf-8")
    return target
