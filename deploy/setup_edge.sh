#!/usr/bin/env bash
# Set up a Raspberry Pi / Jetson (aarch64 Linux, systemd) as a SuperNode of this project, run by systemd.
#
#   sudo deploy/setup_edge.sh --superlink 192.168.1.10:9093 --ca certs/ca.crt --key certs/nodes/node-3 \
#        --partition 3 --partitions 10 [--data-dir /var/lib/pflower/data] [--torch-index URL] \
#        [--python python3.13] [--clientapp warm|cold] [--dry-run]
#
# Installs the project's device set (no extras) into the venv /opt/pflower/.venv in one pip resolution, with the
# board's Python 3.11, 3.12 or 3.13 (the newest found, or --python): its own pins choose torch (aarch64: PyPI's
# manylinux_2_28 wheels, so glibc >= 2.28; --torch-index adds another index, e.g. a CUDA build for a Jetson),
# creates the data dir, copies the CA and the node's private key to /var/lib/pflower (mode 0600), writes
# /etc/pflower/supernode.env and enables flower-supernode.service (restarts forever). --clientapp warm (the
# default) installs it from flower-supernode-warm.service: the SuperNode and one long-lived ClientApp process that
# serves every message, run as a pair by /opt/pflower/warm-supernode.sh; cold: Flower starts a ClientApp process
# per message (~5 CPU-seconds each). --dry-run prints every step instead of doing it.
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "setup_edge: $*" >&2; exit 2; }

REPO="$(cd "$(dirname "$0")/.." && pwd)"
PREFIX=/opt/pflower
HOME_DIR=/var/lib/pflower
SUPERLINK="" CA="" KEY="" PARTITION="" PARTITIONS="" DATA_DIR="" TORCH_INDEX="" DRY_RUN=0 PYTHON="" CLIENTAPP=warm
while [ $# -gt 0 ]; do
  case "$1" in
    --superlink) SUPERLINK="${2:-}"; shift 2 ;;
    --ca) CA="${2:-}"; shift 2 ;;
    --key) KEY="${2:-}"; shift 2 ;;
    --partition) PARTITION="${2:-}"; shift 2 ;;
    --partitions) PARTITIONS="${2:-}"; shift 2 ;;
    --data-dir) DATA_DIR="${2:-}"; shift 2 ;;
    --torch-index) TORCH_INDEX="${2:-}"; shift 2 ;;
    --python) PYTHON="${2:-}"; shift 2 ;;
    --clientapp) CLIENTAPP="${2:-}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

[ -n "$SUPERLINK" ] && [ -n "$CA" ] && [ -n "$KEY" ] && [ -n "$PARTITION" ] && [ -n "$PARTITIONS" ] \
  || die "--superlink, --ca, --key, --partition and --partitions are required (see --help)"
[[ "$SUPERLINK" =~ ^[A-Za-z0-9.-]+:[0-9]+$ ]] || die "--superlink must be HOST:PORT, got '$SUPERLINK'"
[[ "$PARTITION" =~ ^[0-9]+$ && "$PARTITIONS" =~ ^[0-9]+$ ]] || die "--partition and --partitions must be whole numbers"
[ "$PARTITION" -lt "$PARTITIONS" ] || die "--partition must be below --partitions ($PARTITION >= $PARTITIONS)"
[ -f "$CA" ] || die "CA certificate '$CA' not found (deploy/generate_certs.py writes ca.crt)"
[ -f "$KEY" ] || die "private key '$KEY' not found (deploy/generate_certs.py writes nodes/NAME)"
[[ "$CLIENTAPP" =~ ^(warm|cold)$ ]] || die "--clientapp must be warm or cold, got '$CLIENTAPP'"
if [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then die "run as root (sudo), or with --dry-run to see the steps"; fi

ARCH="$(uname -m)"
if [ "$ARCH" != aarch64 ]; then echo "setup_edge: note: this is $ARCH, not aarch64; the pyproject picks its torch" >&2; fi
if [ -f /etc/nv_tegra_release ]; then
  echo "setup_edge: Jetson detected: without --torch-index the CPU build of torch is installed (device=auto then uses the CPU)" >&2
fi

run() { if [ "$DRY_RUN" = 1 ]; then echo "+ $*"; else "$@"; fi; }
write() {  # write FILE MODE (content on stdin)
  local file="$1" mode="$2" content
  content="$(cat)"
  if [ "$DRY_RUN" = 1 ]; then printf '+ write %s (mode %s):\n%s\n' "$file" "$mode" "$content"; return; fi
  printf '%s\n' "$content" > "$file.tmp" && chmod "$mode" "$file.tmp" && mv "$file.tmp" "$file"
}

# The project supports Python 3.11-3.13 (Flower >= 3.11; torch's wheels); the newest the board has is taken.
supported() { "$1" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; }
if [ -n "$PYTHON" ]; then
  command -v "$PYTHON" >/dev/null || [ "$DRY_RUN" = 1 ] || die "--python '$PYTHON' not found"
  [ "$DRY_RUN" = 1 ] || supported "$PYTHON" || die "--python '$PYTHON' is not Python 3.11, 3.12 or 3.13"
else
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null && supported "$candidate"; then PYTHON="$candidate"; break; fi
  done
  if [ -z "$PYTHON" ]; then
    [ "$DRY_RUN" = 1 ] || die "no Python 3.11-3.13 found: Raspberry Pi OS 13 and Debian 13 ship 3.13, Raspberry Pi OS 12 3.11, Ubuntu 24.04 3.12 (apt install python3-venv); on Ubuntu 22.04 (JetPack 6) add one from the deadsnakes PPA"
    PYTHON=python3
  fi
fi
UNIT=flower-supernode-warm.service
[ "$CLIENTAPP" = warm ] || UNIT=flower-supernode.service
INDEX_ARGS=()
[ -n "$TORCH_INDEX" ] && INDEX_ARGS=(--index-url "$TORCH_INDEX" --extra-index-url https://pypi.org/simple)
DATA_DIR="${DATA_DIR:-$HOME_DIR/data}"

if ! id -u pflower >/dev/null 2>&1; then
  run useradd --system --home-dir "$HOME_DIR" --shell /usr/sbin/nologin pflower
fi
run install -d -o pflower -g pflower -m 0750 "$HOME_DIR" "$HOME_DIR/state" "$HOME_DIR/flwr-home"
run install -d -o pflower -g pflower -m 0750 "$DATA_DIR"
run install -d -m 0755 "$PREFIX" /etc/pflower
run install -o pflower -g pflower -m 0644 "$CA" "$HOME_DIR/ca.crt"
run install -o pflower -g pflower -m 0600 "$KEY" "$HOME_DIR/node.key"
run "$PYTHON" -m venv "$PREFIX/.venv"
run "$PREFIX/.venv/bin/pip" install "${INDEX_ARGS[@]}" "$REPO"
NODE_CONFIG="partition-id=$PARTITION num-partitions=$PARTITIONS state-dir='$HOME_DIR/state'"
write /etc/pflower/supernode.env 0644 <<ENV
PFL_CA=$HOME_DIR/ca.crt
PFL_KEY=$HOME_DIR/node.key
PFL_SUPERLINK=$SUPERLINK
PFL_NODE_CONFIG="$NODE_CONFIG"
PFL_DATA_DIR=$DATA_DIR
ENV
# PFL_DATA_DIR: where this device's ClientApp finds MNIST/Fashion-MNIST/CIFAR-10 when the run config leaves
# data-dir empty (the torchvision layout; the embedded digits dataset needs nothing)
[ "$CLIENTAPP" = cold ] || run install -m 0755 "$REPO/deploy/warm-supernode.sh" "$PREFIX/warm-supernode.sh"
run install -m 0644 "$REPO/deploy/systemd/$UNIT" /etc/systemd/system/flower-supernode.service
run systemctl daemon-reload
run systemctl enable flower-supernode.service
run systemctl restart flower-supernode.service
echo "setup_edge: SuperNode ($CLIENTAPP ClientApp) for partition $PARTITION of $PARTITIONS -> $SUPERLINK; logs: journalctl -u flower-supernode -f"
