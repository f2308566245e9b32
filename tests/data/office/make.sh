#!/usr/bin/env bash
# Rebuild the office fixtures from the three flat OpenDocument sources here, with LibreOffice headless (Debian's
# libreoffice-{writer,calc,impress}-nogui). Run once and commit the outputs; the tests only read them.
# The texts are gdk-pixbuf's own messages (tests/data/gdk-pixbuf.es.po), so the fixtures hold real software strings.
set -euo pipefail
cd "$(dirname "$0")"
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
convert() {  # source, format[:filter]
    soffice -env:UserInstallation="file://$profile" --headless --norestore --convert-to "$2" "$1" --outdir . >/dev/null
}
convert source.fodt odt
convert source.fodt epub
convert source.fods ods
convert source.fods xlsx
convert source.fodp odp
convert source.fodp pptx
for f in source.odt source.epub source.ods source.xlsx source.odp source.pptx; do
    mv "$f" "gdk-pixbuf.${f#source.}"
done
ls -l gdk-pixbuf.*
