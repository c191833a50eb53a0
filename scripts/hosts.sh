#!/usr/bin/env bash
# Test hosts on this machine: network namespaces that stand for the hosts of
# a cluster (docs/cluster.md).
#
#   scripts/hosts.sh up N [--rate RATE]   make hosts h1 ... hN (root only)
#   scripts/hosts.sh down                 remove every host this script made
#   scripts/hosts.sh rsh HOST CMD...      run CMD "on" HOST: what `ssh HOST CMD`
#                                         does on a cluster (Open MPI's
#                                         plm_rsh_agent: mpirun starts its
#                                         daemons this way)
#   scripts/hosts.sh list                 the hosts up, one "NAME ADDRESS" a line
#
# Each host is a namespace `tdx-hK` with its own network stack: one link
# (a veth pair) to the bridge `tdxbr0` in the root namespace, address
# 10.77.0.K/24 (the root namespace is 10.77.0.254), and its own host name
# (a UTS namespace entered by `rsh`). The names h1 ... hN resolve from every
# host and from the root namespace (a marked block in /etc/hosts, which the
# namespaces share). `--rate 1gbit` limits each host's link both ways with a
# token bucket (tc tbf). `down` removes the namespaces, the bridge, the links
# and the /etc/hosts block, whatever state an earlier run left. Traffic stays
# on the bridge: no route leads out of it.
set -euo pipefail
SUBNET=10.77.0
BRIDGE=tdxbr0
MARK="# tdx test hosts"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

hosts() {  # the namespaces this script made
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^tdx-h[0-9]+$' | sort -V || true
}

write_hosts() {  # write_hosts TEXT: /etc/hosts becomes TEXT, never seen half-written
  local tmp="/etc/.hosts.tdx.$$"
  printf '%s\n' "$1" > "$tmp"
  chmod --reference=/etc/hosts "$tmp" 2>/dev/null || true
  # Renamed over it, so that a process resolving a name meanwhile (another
  # test's gloo) reads the old file or the new one; in place where /etc/hosts
  # is a mount that cannot be replaced.
  if ! mv -f "$tmp" /etc/hosts 2>/dev/null; then
    printf '%s\n' "$1" > /etc/hosts
    rm -f "$tmp"
  fi
}

down() {
  for ns in $(hosts); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
                grep -E '^tdxh[0-9]+$' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if grep -q " $MARK\$" /etc/hosts 2>/dev/null; then
    write_hosts "$(grep -v " $MARK\$" /etc/hosts || true)"
  fi
}

up() {
  local n="${1:-}" rate=""
  shift || true
  [[ "$n" =~ ^[0-9]+$ && $n -ge 1 && $n -le 250 ]] || {
    echo "hosts.sh up: give a host count from 1 to 250, got '${n}'" >&2; exit 2; }
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --rate) rate="${2:?--rate takes a tc rate, e.g. 1gbit}"; shift 2 ;;
      *) echo "hosts.sh up: unknown option $1" >&2; usage ;;
    esac
  done
  [[ $(id -u) == 0 ]] || { echo "hosts.sh up: needs root (ip netns)" >&2; exit 2; }
  down
  ip link add "$BRIDGE" type bridge
  ip addr add "$SUBNET.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local entries=""
  for k in $(seq 1 "$n"); do
    local ns="tdx-h$k" outer="tdxh$k"
    ip netns add "$ns"
    ip link add "$outer" type veth peer name eth0 netns "$ns"
    ip link set "$outer" master "$BRIDGE" up
    ip netns exec "$ns" ip addr add "$SUBNET.$k/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    if [[ -n "$rate" ]]; then
      tc qdisc add dev "$outer" root tbf rate "$rate" burst 256kb latency 50ms
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
    fi
    entries+="$SUBNET.$k h$k $MARK"$'\n'
  done
  write_hosts "$(cat /etc/hosts)"$'\n'"${entries%$'\n'}"
}

rsh() {
  local host="${1:?hosts.sh rsh HOST CMD...}"
  shift
  [[ "$host" =~ ^h[0-9]+$ ]] || { echo "hosts.sh rsh: no test host '$host' (h1, h2, ...)" >&2; exit 255; }
  ip netns list | awk '{print $1}' | grep -qx "tdx-$host" ||
    { echo "hosts.sh rsh: host $host is not up (scripts/hosts.sh up N)" >&2; exit 255; }
  # The command as ssh runs it: one string for the host's shell, there with
  # its own host name.
  exec ip netns exec "tdx-$host" unshare --uts sh -c "hostname $host && $*"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  rsh) shift; rsh "$@" ;;
  list)
    for ns in $(hosts); do echo "${ns#tdx-} $SUBNET.${ns#tdx-h}"; done ;;
  -h|--help) usage 0 ;;
  *) usage ;;
esac
