#!/usr/bin/env bash
# An emulated aarch64 device (a Raspberry Pi / Jetson class board) on an x86_64 Linux machine: an arm64 Debian root
# made with debootstrap, run through qemu-user (binfmt_misc), with the project's device install inside it.
#
#   sudo deploy/emulated-device.sh setup   [--root DIR] [--suite bookworm] [--mirror URL] [--fresh]
#   sudo deploy/emulated-device.sh supernode [--root DIR] --superlink HOST:PORT --ca FILE --key FILE \
#        --partition I --partitions N [--state-dir DIR] [--data-dir DIR] [--isolation subprocess|process] \
#        [--runtime-port PORT]
#   sudo deploy/emulated-device.sh exec    [--root DIR] -- COMMAND [ARGS...]
#
# setup: registers qemu-aarch64 with binfmt_misc where missing (Debian: apt-get install qemu-user-static debootstrap),
# makes the arm64 root (default /var/lib/pflower-emulated/arm64, outside any checkout), trusts the host's local CA
# folder /usr/local/share/ca-certificates there (a proxy's CA, if the host needs one to reach the package index),
# copies this checkout's files (tracked and untracked, not ignored) to /opt/pflower/src inside and runs exactly the
# device install, `pip install .` into /opt/pflower/venv with the root's own Python (bookworm: 3.11; trixie: 3.13),
# in a clean environment (env -i). It writes /opt/pflower/install-report.txt inside the root: Python, seconds, venv
# size and `pip freeze`, and fails if Ray or pandas came in (they are not device packages). Run again, it keeps the
# venv and reinstalls only the project from the copied checkout (a minute, not the ~13 of torch's wheel under
# emulation); --fresh makes the venv anew and the report with it.
# supernode: copies the CA certificate and the node's private key into the root (0600) and runs flower-supernode
# there with TLS and node authentication, as deploy/setup_edge.sh's service does; the root shares this machine's
# network, so a SuperLink on 127.0.0.1 is reachable. --isolation process runs the SuperNode with its long-lived
# ClientApp (`pflower-clientapp`, one process for every message) as one pair, deploy/warm-supernode.sh, on the
# Runtime API port --runtime-port (default 9094 + the partition), as setup_edge.sh's default service does.
# Emulation runs arm64 code 10-20x slower than the native CPU.
# exec: runs one command inside the root (proc, sys and dev mounted for its duration), e.g. `-- uname -m`.
set -euo pipefail

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "emulated-device: $*" >&2; exit 2; }

REPO="$(cd "$(dirname "$0")/.." && pwd)"
COMMAND="${1:-}"; [ -n "$COMMAND" ] || usage; shift
ROOT=/var/lib/pflower-emulated/arm64 SUITE=bookworm MIRROR=http://deb.debian.org/debian FRESH=0
SUPERLINK="" CA="" KEY="" PARTITION="" PARTITIONS="" STATE_DIR="" DATA_DIR="" ISOLATION=subprocess RUNTIME_PORT=""
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT="${2:-}"; shift 2 ;;
    --suite) SUITE="${2:-}"; shift 2 ;;
    --mirror) MIRROR="${2:-}"; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --runtime-port) RUNTIME_PORT="${2:-}"; shift 2 ;;
    --superlink) SUPERLINK="${2:-}"; shift 2 ;;
    --ca) CA="${2:-}"; shift 2 ;;
    --key) KEY="${2:-}"; shift 2 ;;
    --partition) PARTITION="${2:-}"; shift 2 ;;
    --partitions) PARTITIONS="${2:-}"; shift 2 ;;
    --state-dir) STATE_DIR="${2:-}"; shift 2 ;;
    --data-dir) DATA_DIR="${2:-}"; shift 2 ;;
    --isolation) ISOLATION="${2:-}"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) usage ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot and binfmt_misc need it)"
[ -n "$ROOT" ] || die "--root must not be empty"
ROOT="$(realpath -m "$ROOT")"
[ "$ROOT" != / ] || die "--root must not be /"

ensure_binfmt() {
  [ "$(uname -m)" = aarch64 ] && return 0
  command -v qemu-aarch64-static >/dev/null || [ -x /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] \
    || die "qemu-user-static is missing (Debian: apt-get install qemu-user-static)"
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || die "cannot mount binfmt_misc"
  fi
  if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    if command -v update-binfmts >/dev/null && [ -f /usr/share/binfmts/qemu-aarch64 ]; then
      update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
      update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    fi
  fi
  if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    # The F flag loads the interpreter now, so the root needs no copy of it.
    local interp; interp="$(command -v qemu-aarch64-static)"
    printf '%s' ":qemu-aarch64:M::\\x7fELF\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00:\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff:$interp:FP" \
      > /proc/sys/fs/binfmt_misc/register || die "cannot register qemu-aarch64 with binfmt_misc"
  fi
}

MOUNTED=()
unmount_all() {
  local i
  for (( i=${#MOUNTED[@]}-1; i>=0; i-- )); do umount -l "${MOUNTED[$i]}" 2>/dev/null || true; done
  MOUNTED=()
}
mount_root() {
  trap unmount_all EXIT
  local target
  for target in proc sys dev dev/pts; do
    mkdir -p "$ROOT/$target"
    if ! mountpoint -q "$ROOT/$target"; then
      case "$target" in
        proc) mount -t proc proc "$ROOT/proc" ;;
        *) mount --bind "/$target" "$ROOT/$target" ;;
      esac
      MOUNTED+=("$ROOT/$target")
    fi
  done
  cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
}
ROOT_ENV=()
in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/opt/pflower/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "${ROOT_ENV[@]}" "$@"
}

setup() {
  command -v debootstrap >/dev/null || die "debootstrap is missing (Debian: apt-get install debootstrap)"
  ensure_binfmt
  local started; started=$(date +%s)
  if [ ! -x "$ROOT/usr/bin/python3" ]; then
    mkdir -p "$ROOT"; chmod 0755 "$ROOT"
    echo "emulated-device: debootstrap $SUITE arm64 into $ROOT (several minutes)"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      "$SUITE" "$ROOT" "$MIRROR" > "$ROOT.debootstrap.log" 2>&1 \
      || die "debootstrap failed: see $ROOT.debootstrap.log"
  fi
  mount_root
  in_root uname -m | grep -qx aarch64 || die "the root does not run as aarch64 (binfmt_misc registration?)"
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$ROOT/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
    in_root update-ca-certificates >/dev/null
  fi
  echo "emulated-device: copying $REPO into $ROOT/opt/pflower/src"
  rm -rf "$ROOT/opt/pflower/src"; mkdir -p "$ROOT/opt/pflower/src"
  (cd "$REPO" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) \
    | tar -C "$ROOT/opt/pflower/src" -xf -
  local report="$ROOT/opt/pflower/install-report.txt"
  if [ "$FRESH" = 0 ] && [ -x "$ROOT/opt/pflower/venv/bin/flower-supernode" ] && [ -f "$report" ]; then
    echo "emulated-device: the venv exists; reinstalling the project alone (--fresh makes it anew)"
    in_root sh -c 'cd /opt/pflower/src && pip install -q --disable-pip-version-check --no-cache-dir --no-deps \
      --force-reinstall .' || die "pip install --no-deps . failed inside the root"
    in_root python -c "import torch, flwr, common, client_app.warm; print('torch', torch.__version__, 'flwr', flwr.__version__)" \
      || die "the device install does not import"
    echo "project reinstalled: $(date -u +%FT%TZ)" >> "$report"
    return 0
  fi
  local before; before=$(date +%s)
  rm -rf "$ROOT/opt/pflower/venv"
  in_root python3 -m venv /opt/pflower/venv
  echo "emulated-device: pip install . inside the root (emulated: tens of minutes for torch's wheel)"
  in_root sh -c 'cd /opt/pflower/src && pip install -q --disable-pip-version-check --no-cache-dir .' \
    || die "pip install . failed inside the root"
  local after; after=$(date +%s)
  {
    echo "machine: $(in_root uname -m)"
    echo "python: $(in_root python3 --version 2>&1)"
    echo "install seconds (pip install ., emulated): $((after - before))"
    echo "setup seconds (all, emulated): $((after - started))"
    echo "venv MB: $(du -sm "$ROOT/opt/pflower/venv" | cut -f1)"
    echo "packages:"
    in_root pip freeze --exclude-editable | sed 's/^/  /'
  } > "$report"
  if grep -Eiq '^  (ray|pandas)==' "$report"; then die "Ray or pandas was installed on the device (see $report)"; fi
  in_root python -c "import torch, flwr, common, client_app.warm; print('torch', torch.__version__, 'flwr', flwr.__version__)" \
    || die "the device install does not import"
  cat "$report" | sed -n '1,5p'
}

supernode() {
  [ -n "$SUPERLINK" ] && [ -n "$CA" ] && [ -n "$KEY" ] && [ -n "$PARTITION" ] && [ -n "$PARTITIONS" ] \
    || die "supernode needs --superlink, --ca, --key, --partition and --partitions"
  [[ "$SUPERLINK" =~ ^[A-Za-z0-9.-]+:[0-9]+$ ]] || die "--superlink must be HOST:PORT, got '$SUPERLINK'"
  [[ "$PARTITION" =~ ^[0-9]+$ && "$PARTITIONS" =~ ^[0-9]+$ ]] || die "--partition and --partitions must be whole numbers"
  [ -f "$CA" ] && [ -f "$KEY" ] || die "CA certificate or key not found"
  [[ "$ISOLATION" =~ ^(subprocess|process)$ ]] || die "--isolation must be subprocess or process"
  RUNTIME_PORT="${RUNTIME_PORT:-$((9094 + PARTITION))}"
  [[ "$RUNTIME_PORT" =~ ^[0-9]+$ ]] && [ "$RUNTIME_PORT" -ge 1 ] && [ "$RUNTIME_PORT" -le 65535 ] \
    || die "--runtime-port must be a port number, got '$RUNTIME_PORT'"
  [ -x "$ROOT/opt/pflower/venv/bin/flower-supernode" ] || die "no device install in $ROOT: run setup first"
  ensure_binfmt
  mount_root
  local keys=/opt/pflower/keys/node-$PARTITION state=${STATE_DIR:-/var/lib/pflower/node-$PARTITION}
  install -d -m 0700 "$ROOT$keys" "$ROOT$state"
  install -m 0600 "$CA" "$ROOT$keys/ca.crt"
  install -m 0600 "$KEY" "$ROOT$keys/node.key"
  ROOT_ENV=(FLWR_DISABLE_UPDATE_CHECK=1 "FLWR_HOME=$state/flwr-home")
  [ -z "$DATA_DIR" ] || ROOT_ENV+=("PFL_DATA_DIR=$DATA_DIR")
  # the ClientApp's message profile (common/profiling.py), a folder inside the root (bench/emulated_federation.py)
  [ -z "${PFLOWER_PROFILE:-}" ] || ROOT_ENV+=("PFLOWER_PROFILE=$PFLOWER_PROFILE")
  local config="partition-id=$PARTITION num-partitions=$PARTITIONS state-dir=\"$state\""
  local args=(--root-certificates "$keys/ca.crt" --auth-supernode-private-key "$keys/node.key" --superlink "$SUPERLINK"
    --node-config "$config" "${EXTRA[@]}")
  if [ "$ISOLATION" = process ]; then
    # the SuperNode and its long-lived ClientApp as one pair (deploy/warm-supernode.sh, as the device recipe runs it)
    [ -x "$ROOT/opt/pflower/venv/bin/pflower-clientapp" ] || die "the root's install has no pflower-clientapp: run setup"
    in_root /opt/pflower/src/deploy/warm-supernode.sh --runtime-port "$RUNTIME_PORT" -- "${args[@]}"
  else
    in_root flower-supernode "${args[@]}" --isolation subprocess --port "$RUNTIME_PORT"
  fi
}

case "$COMMAND" in
  setup) setup ;;
  supernode) supernode ;;
  exec) [ ${#EXTRA[@]} -gt 0 ] || die "exec needs a command after --"; ensure_binfmt; mount_root; in_root "${EXTRA[@]}" ;;
  -h|--help) usage ;;
  *) die "unknown command '$COMMAND' (setup, supernode or exec)" ;;
esac
