#!/usr/bin/env bash
# make test-dist: installs the .deb that make dist built with dpkg, as a
# node would, then, from the installed paths only: gpupin detect on
# simulated facts, the kubectl-gpupin link's help, and a provision (cu13's simulated probe fails, cu129 is
# pinned) against a private containerd and registry (gpupin-sandbox, as in
# make demo), its probe programs found in /usr/lib/gpupin. Then dpkg -r
# (the conffile stays) and dpkg -P (nothing of the package stays).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-bin}
deb=${DEB:?DEB names the .deb (make test-dist)}
fail() { echo "dist-test: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run it as root: it installs a package"
[ -f "$deb" ] || fail "no $deb (make dist)"
if dpkg-query -W -f='${Status}' gpupin 2>/dev/null | grep -q installed; then
	fail "a gpupin package is installed already; this test installs and purges its own"
fi

work=$(mktemp -d /tmp/gpupin-dist-test.XXXXXX)
sandbox_pid=
cleanup() {
	[ -n "$sandbox_pid" ] && kill "$sandbox_pid" 2>/dev/null && wait "$sandbox_pid" 2>/dev/null
	if dpkg-query -W -f='${Status}' gpupin 2>/dev/null | grep -q "ok installed\|config-files"; then
		dpkg -P gpupin >/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "== dpkg -i $deb"
dpkg -i "$deb"
files=(/usr/bin/gpupin /usr/lib/gpupin/gpupin-cuda-probe /usr/lib/gpupin/gpupin-sim-probe
	/lib/systemd/system/gpupin-agent.service /etc/gpupin/agent.yaml)
for f in "${files[@]}"; do [ -f "$f" ] || fail "$f is not installed"; done
grep -q '^ExecStart=/usr/bin/gpupin ' /lib/systemd/system/gpupin-agent.service ||
	fail "the unit does not start /usr/bin/gpupin"
# kubectl gpupin runs the kubectl-gpupin on PATH: the link to gpupin.
[ "$(readlink /usr/bin/kubectl-gpupin)" = gpupin ] || fail "/usr/bin/kubectl-gpupin is not a link to gpupin"
dpkg-query -W -f='${Conffiles}\n' gpupin | grep -q '^ /etc/gpupin/agent.yaml ' ||
	fail "/etc/gpupin/agent.yaml is not a conffile"
# Nothing starts on install: no maintainer scripts, no enabled unit, no agent.
for s in preinst postinst prerm postrm; do
	[ ! -e "/var/lib/dpkg/info/gpupin.$s" ] || fail "the package has a $s script"
done
[ ! -e /etc/systemd/system/multi-user.target.wants/gpupin-agent.service ] || fail "the unit was enabled"
pgrep -f '^/usr/bin/gpupin' >/dev/null && fail "a gpupin process runs after the install"
dpkg -L gpupin >"$work/listed"

echo "== the installed gpupin"
# Nothing but the installed paths: no GPUPIN_LIBDIR, and gpupin is not beside the probes.
gp() { env -u GPUPIN_LIBDIR /usr/bin/gpupin "$@"; }
gp detect --node examples/nodes/h100-driver580.json | tee "$work/detect"
grep -q 'SIMULATED' "$work/detect" || fail "detect on simulated facts does not say SIMULATED"
gp agent --help >"$work/agent-help"
grep -q -- '--sweep-every' "$work/agent-help" || fail "gpupin agent --help"
env -u GPUPIN_LIBDIR /usr/bin/kubectl-gpupin --help >"$work/plugin-help"
grep -q '^   kubectl gpupin \[--kubeconfig FILE\]' "$work/plugin-help" || fail "kubectl-gpupin --help does not name kubectl gpupin"

"$bin/gpupin-sandbox" --env-file "$work/env" 2>"$work/sandbox.log" &
sandbox_pid=$!
for _ in $(seq 1 300); do [ -f "$work/env" ] && break; sleep 0.1; done
[ -f "$work/env" ] || { cat "$work/sandbox.log"; fail "gpupin-sandbox did not start"; }
# shellcheck disable=SC1091
. "$work/env"
ref="$GPUPIN_REGISTRY/demo-engine:1.0.0"
gp --address "$CONTAINERD_ADDRESS" --namespace gpupin-dist-test --overrides "$work/overrides.yaml" \
	provision "$ref" --node examples/nodes/h100-driver580.json \
	--runc-root "$GPUPIN_RUNC_ROOT" --probe-dir "$work/probe" --json >"$work/provision.json" ||
	{ cat "$work/provision.json"; fail "provision from the installed gpupin failed"; }
grep -q '"state": *"ready"' "$work/provision.json" && grep -q '"variant": *"cu129"' "$work/provision.json" ||
	{ cat "$work/provision.json"; fail "provision is not ready on cu129"; }
echo "provisioned $ref: ready, cu129 (the installed probe programs ran)"

echo "== dpkg -r gpupin"
dpkg -r gpupin
for f in /usr/bin/gpupin /usr/bin/kubectl-gpupin /usr/lib/gpupin /lib/systemd/system/gpupin-agent.service; do
	[ ! -e "$f" ] && [ ! -L "$f" ] || fail "$f is left after dpkg -r"
done
[ -f /etc/gpupin/agent.yaml ] || fail "dpkg -r removed the conffile (it keeps it until a purge)"

echo "== dpkg -P gpupin"
dpkg -P gpupin
dpkg-query -W gpupin >/dev/null 2>&1 && fail "dpkg still knows gpupin after the purge"
# Every path the package listed is gone, but the directories others share.
while read -r p; do
	case "$p" in /. | /etc | /lib | /lib/systemd | /lib/systemd/system | /usr | /usr/bin | /usr/lib) continue ;; esac
	[ ! -e "$p" ] && [ ! -L "$p" ] || fail "$p is left after dpkg -P"
done <"$work/listed"
echo "dist-test: installed, detected, provisioned and purged cleanly"
