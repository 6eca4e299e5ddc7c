#!/bin/sh
# Run every Fuzz* target in the module for a while each (default 30s):
#   scripts/fuzz.sh [duration]
# Go fuzzes one target per invocation, so they run one after another; new
# failing inputs land in the package's testdata/fuzz/ for the usual tests.
set -eu
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
GO="${GO:-go}"
time="${1:-30s}"
targets=$(grep -rn --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*(' . | sed -E 's|^\./(.*)/[^/]*_test\.go:[0-9]+:func (Fuzz[A-Za-z0-9_]*)\(.*|\1 \2|' | sort -u)
if [ -z "$targets" ]; then
	echo "fuzz: no Fuzz targets found" >&2
	exit 1
fi
echo "$targets" | while read -r dir name; do
	echo "fuzz: $name in ./$dir for $time" >&2
	"$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$time" "./$dir"
done
