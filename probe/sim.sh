# gpupin simulated probe: emulates a GPU verdict on a node without a GPU.
# POSIX sh only (images may have busybox and no bash); external commands
# are limited to sleep and rm. gpupin sets:
#   GPUPIN_SIM_DEVICES    JSON array of devices, echoed in the verdict
#   GPUPIN_SIM_NODE_CUDA  the CUDA version the simulated driver supports (e.g. 12.9)
# and reads from the image's own environment:
#   GPUPIN_SIM_PROBE      fail|hang|garbled|noline|exit1|big: misbehave on purpose
#   CUDA_VERSION          the image's CUDA (e.g. 12.9.1); a newer major.minor than the node fails

# Diagnostics first: integration tests assert the container's hardening from them.
net=
for i in /sys/class/net/*; do
	[ -e "$i" ] && net="$net ${i##*/}"
done
echo "GPUPIN-SIM net=${net# }"
if (: >/.gpupin-rw-test) 2>/dev/null; then
	rm -f /.gpupin-rw-test 2>/dev/null
	echo "GPUPIN-SIM rootfs-writable=yes"
else
	echo "GPUPIN-SIM rootfs-writable=no"
fi
capeff=
nonewprivs=
uid=
if [ -r /proc/self/status ]; then
	while IFS= read -r line; do
		case $line in
		CapEff:*) capeff=${line#CapEff:} ;;
		NoNewPrivs:*) nonewprivs=${line#NoNewPrivs:} ;;
		Uid:*) uid=${line#Uid:} ;;
		esac
	done </proc/self/status
fi
trim() { set -- $1; echo "$1"; }
echo "GPUPIN-SIM capeff=$(trim "$capeff")"
echo "GPUPIN-SIM nonewprivs=$(trim "$nonewprivs")"
echo "GPUPIN-SIM uid=$(trim "$uid")"
echo "GPUPIN-SIM env=${GPUPIN_CDI_TEST-}"
devs=
for d in /dev/gpupin-test*; do
	[ -e "$d" ] && devs="$devs $d"
done
echo "GPUPIN-SIM devices=${devs# }"

devices=${GPUPIN_SIM_DEVICES:-[]}
node=${GPUPIN_SIM_NODE_CUDA-}

# verdict OK DETAIL [RUNTIME-EXTRA]: DETAIL and RUNTIME-EXTRA must be JSON-safe.
verdict() {
	printf 'GPUPIN-PROBE {"ok":%s,"devices":%s,"runtime":{"simulated":true%s},"detail":"%s"}\n' \
		"$1" "$devices" "${3-}" "$2"
}

# version X: succeed if X is digits and dots, like 13 or 12.9.1 (JSON-safe to echo).
version() {
	case $1 in
	'' | *[!0-9.]* | .* | *. | *..*) return 1 ;;
	*) return 0 ;;
	esac
}

# minor X: the minor part of version X, 0 when it has none.
minor() {
	case $1 in
	*.*)
		m=${1#*.}
		echo "${m%%.*}"
		;;
	*) echo 0 ;;
	esac
}

mode=${GPUPIN_SIM_PROBE-}
case $mode in
'') ;;
fail)
	verdict false "simulated failure: GPUPIN_SIM_PROBE=fail"
	exit 1
	;;
hang)
	while :; do sleep 3600; done
	;;
garbled)
	echo 'GPUPIN-PROBE {"ok":tru'
	exit 0
	;;
noline)
	exit 0
	;;
exit1)
	verdict true "simulated: valid verdict, exit code 1"
	exit 1
	;;
big)
	s=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
	s="$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s" # 1 KiB, plus the newline
	i=0
	while [ $i -lt 1024 ]; do
		echo "$s"
		i=$((i + 1))
	done
	;;
*)
	case $mode in
	*[!A-Za-z0-9_-]*) mode="(unprintable)" ;;
	esac
	verdict false "simulated failure: unknown GPUPIN_SIM_PROBE=$mode (want fail, hang, garbled, noline, exit1 or big)"
	exit 1
	;;
esac

image=${CUDA_VERSION-}
extra=
if version "$image"; then
	extra=",\"image_cuda\":\"$image\""
	if version "$node"; then
		extra="$extra,\"node_cuda\":\"$node\""
		imaj=${image%%.*} imin=$(minor "$image")
		nmaj=${node%%.*} nmin=$(minor "$node")
		if [ "$imaj" -gt "$nmaj" ] || { [ "$imaj" -eq "$nmaj" ] && [ "$imin" -gt "$nmin" ]; }; then
			verdict false "CUDA driver version is insufficient for CUDA runtime version (simulated: image CUDA $image, node supports $node)" "$extra"
			exit 1
		fi
	fi
fi
verdict true "simulated" "$extra"
exit 0
