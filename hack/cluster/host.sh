#!/usr/bin/env bash
# The test cluster as a neighbour on its host's network namespace (sourced by hack/cluster-up.sh
# and cluster-down.sh, after lib.sh and procs.sh, never run):
#   - refuse_neighbour_network: cluster-up's refusal, in one line, to start beside another
#     Kubernetes in this network namespace or on a range that overlaps a route already here;
#   - record_host: what was here before the cluster (iptables chains, ipsets, network namespaces,
#     routes, IPVS services), written once into the state folder, so that cluster-down removes only
#     what came after and is the cluster's by its names, bridge and comments;
#   - remove_our_iptables: the cluster's rules and chains, through iptables-save and
#     iptables-restore (never `eval` of a rule's text);
#   - shared_netns_dir, remove_netns: /run/netns made a shared mount point (as `ip netns add`
#     makes it) before the pods' namespaces are mounted there, and the pods' namespaces removed
#     with every mount of them, stacked ones too.
# IPVS is never touched: the cluster's kube-proxy runs in iptables mode and kube-router's service
# proxy is off, so no IPVS service is the cluster's (`kube-proxy --cleanup` and
# `kube-router --cleanup-config` would flush every one on the host: neither is run).

HOST_RECORD="${STATE}/host-before"
NETNS_DIR="${GPUPIPE_NETNS_DIR:-/run/netns}"
# Processes that run another Kubernetes' node networking (process names, as `pgrep -x` sees them:
# k3s renames its own to k3s-server or k3s-agent, MicroK8s runs kubelite).
NEIGHBOUR_PROCS="kubelet kube-proxy kube-router k3s k3s-server k3s-agent kubelite k0s rke2 cilium-agent calico-node flanneld"
# The kubelet's and kube-proxy's fixed chains: every Kubernetes node has these same names.
KUBE_CHAINS=" KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT KUBE-PROXY-CANARY KUBE-MARK-MASQ \
KUBE-MARK-DROP KUBE-POSTROUTING KUBE-FORWARD KUBE-SERVICES KUBE-EXTERNAL-SERVICES KUBE-NODEPORTS \
KUBE-PROXY-FIREWALL "
# The CNI network's comment on each rule its bridge and portmap plugins add, as iptables-save
# prints it.
CNI_COMMENT='name: \"gpupipe\"'

ip2int() {
  local a b c d
  IFS=. read -r a b c d <<<"$1"
  echo $(((a << 24) | (b << 16) | (c << 8) | d))
}

# cidrs_overlap A B: the IPv4 ranges A and B (address/length; a bare address is a /32) share an
# address.
cidrs_overlap() {
  local a="$1" b="$2" la lb l mask
  [[ "$a" == */* ]] || a+=/32
  [[ "$b" == */* ]] || b+=/32
  la="${a#*/}" lb="${b#*/}"
  l=$((la < lb ? la : lb))
  mask=$(((0xFFFFFFFF << (32 - l)) & 0xFFFFFFFF))
  ((l == 0)) && mask=0
  [[ $(($(ip2int "${a%/*}") & mask)) == $(($(ip2int "${b%/*}") & mask)) ]]
}

# overlapping_route CIDR: the first IPv4 route of this network namespace (any table) whose
# destination overlaps CIDR, but the default route, the cluster's own bridge's and its nodes'
# links' (gpn-K, hack/cluster/nodes.sh); empty if none.
overlapping_route() {
  local cidr="$1" line dst words
  while read -r line; do
    read -ra words <<<"$line" # the first word is the destination, or the route's type before it
    ((${#words[@]})) || continue
    case "${words[0]}" in
    local | broadcast | unicast | unreachable | blackhole | prohibit | throw | multicast | anycast | nat) dst="${words[1]:-}" ;;
    *) dst="${words[0]}" ;;
    esac
    [[ "$dst" =~ ^[0-9]+(\.[0-9]+){3}(/[0-9]+)?$ ]] || continue # default, or not IPv4
    [[ "$dst" == 0.0.0.0/0 ]] && continue
    [[ " $line " == *" dev gpupipe0 "* || " $line " == *" dev gpn-"* ]] && continue
    if cidrs_overlap "$dst" "$cidr"; then
      printf '%s\n' "$line"
      return 0
    fi
  done < <(ip -4 route show table all 2>/dev/null)
}

# same_netns PID: the process is in this shell's network namespace.
same_netns() {
  [[ "$(readlink "/proc/$1/ns/net" 2>/dev/null)" == "$(readlink /proc/self/ns/net)" ]]
}

# neighbour_kubernetes_process: "NAME (pid PID)" of the first process of another Kubernetes'
# node networking in this network namespace (not one this cluster started); status 1 if none.
neighbour_kubernetes_process() {
  local name pid
  for name in $NEIGHBOUR_PROCS; do
    for pid in $(pgrep -x "$name" 2>/dev/null); do
      ours "$pid" && continue
      same_netns "$pid" || continue
      printf '%s (pid %s)\n' "$name" "$pid"
      return 0
    done
  done
  return 1
}

# recorded FILE NAME: NAME is a line of the record FILE (what was here before cluster-up).
recorded() {
  [[ -f "${HOST_RECORD}/$1" ]] && grep -qxF -- "$2" "${HOST_RECORD}/$1"
}

# neighbour_kubernetes: one phrase naming another Kubernetes in this network namespace, if any
# (status 1 if none): its processes, kube-proxy's KUBE-SERVICES chain (unless this cluster made
# it: its kube-proxy runs, or the chain came after this state folder's record), nftables-mode
# kube-proxy's table (ours, in iptables mode, deletes it when it starts), IPVS-mode kube-proxy's
# kube-ipvs0 device.
neighbour_kubernetes() {
  local proc
  if proc="$(neighbour_kubernetes_process)"; then
    printf 'another Kubernetes runs in this network namespace: %s\n' "$proc"
    return 0
  fi
  if command -v iptables >/dev/null 2>&1 && iptables -w -t nat -S KUBE-SERVICES >/dev/null 2>&1 &&
    ! running kube-proxy; then
    if [[ ! -d "$HOST_RECORD" ]] || recorded chains.iptables.nat KUBE-SERVICES; then
      printf "another Kubernetes' service proxy chain KUBE-SERVICES is in this network namespace's nat table (k3s, MicroK8s, kubeadm, or a cluster that was not removed: iptables -t nat -S KUBE-SERVICES)\n"
      return 0
    fi
  fi
  if command -v nft >/dev/null 2>&1; then
    local family
    for family in ip ip6; do
      if nft list table "$family" kube-proxy >/dev/null 2>&1; then
        printf "another Kubernetes' kube-proxy (nftables mode) has its table '%s kube-proxy' in this network namespace\n" "$family"
        return 0
      fi
    done
  fi
  if ip link show kube-ipvs0 >/dev/null 2>&1; then
    printf "another Kubernetes' kube-proxy (IPVS mode) has its kube-ipvs0 device in this network namespace\n"
    return 0
  fi
  return 1
}

# refuse_neighbour_network: cluster-up's preflight: one line and exit 3 (through `cannot`) beside
# another Kubernetes in this network namespace, or when the pod or service range overlaps a
# route already here (hack/cluster/versions.env names both ranges). Nothing is made before it.
refuse_neighbour_network() {
  local why name cidr route
  if why="$(neighbour_kubernetes)"; then
    cannot "${why}: the test cluster would share its iptables chains and node ports; refusing to start beside it"
  fi
  local names="POD_CIDR SERVICE_CIDR"
  (($(cluster_nodes) == 1)) || names+=" NODE_LINK_CIDR"
  for name in $names; do
    cidr="${!name}"
    route="$(overlapping_route "$cidr")"
    [[ -z "$route" ]] ||
      cannot "the cluster's ${name} ${cidr} overlaps a route of this host (${route}): refusing to start on it (${name} in hack/cluster/versions.env)"
  done
}

# ipt_chains IPT TABLE: the chains of TABLE, one a line (built-in ones too).
ipt_chains() {
  "${1}-save" -t "$2" 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p'
}

# record_host: what this network namespace had before the cluster, into the state folder; once
# (a rerun of cluster-up keeps the first record, made before anything of the cluster's).
record_host() {
  [[ -d "$HOST_RECORD" ]] && return 0
  local tmp="${HOST_RECORD}.tmp" ipt table
  rm -rf "$tmp"
  mkdir -p "$tmp"
  for ipt in iptables ip6tables; do
    command -v "${ipt}-save" >/dev/null 2>&1 || continue
    for table in nat filter mangle raw; do ipt_chains "$ipt" "$table" >"${tmp}/chains.${ipt}.${table}"; done
  done
  if command -v ipset >/dev/null 2>&1; then ipset list -n >"${tmp}/ipsets" 2>/dev/null || true; fi
  ls -A "$NETNS_DIR" >"${tmp}/netns" 2>/dev/null || true
  ip route show table all >"${tmp}/routes" 2>/dev/null || true
  if command -v ipvsadm >/dev/null 2>&1; then ipvsadm -Sn >"${tmp}/ipvs" 2>/dev/null || true; fi
  mv "$tmp" "$HOST_RECORD"
}

# kube_router_chain CHAIN: one of the chains kube-router's network policy controller makes.
kube_router_chain() {
  [[ "$1" =~ ^KUBE-(ROUTER-(INPUT|FORWARD|OUTPUT)|POD-FW-[A-Z0-9]+|NWPLCY-[A-Z0-9]+)$ ]]
}

# kube_chain_ours CHAIN: a Kubernetes chain of this cluster's: one of the kubelet's, kube-proxy's
# or (when this cluster ran it) kube-router's names, made after the record, and no other
# Kubernetes runs here now (its chains would have the same names). RAN_KUBE_ROUTER and
# FOREIGN_KUBE are set by remove_our_iptables.
kube_chain_ours() {
  local chain="$1" ipt="$2" table="$3"
  recorded "chains.${ipt}.${table}" "$chain" && return 1
  if kube_router_chain "$chain"; then
    ((RAN_KUBE_ROUTER))
    return
  fi
  [[ -z "$FOREIGN_KUBE" ]] || return 1
  [[ "$KUBE_CHAINS" == *" ${chain} "* || "$chain" =~ ^KUBE-(SVC|SEP|FW|XLB|EXT|SVL)-[A-Z0-9]{16}$ ]]
}

# our_iptables_ops IPT TABLE: iptables-restore lines (no table header) that remove the cluster's
# rules and chains from TABLE: `-D` for each of its rules in a chain not its own, `-F` then `-X`
# for each of its chains. Its rules: those with the CNI network's comment, the firewall plugin's
# CNI-FORWARD rules for an address inside POD_CIDR (the cluster's own range: cluster-up refuses a
# route that overlaps it), and any jump to one of its chains. Not only the addresses its IPAM
# still holds: a rule can outlive its address (a pod's CNI DEL that released the address but
# found no cached result to undo the firewall plugin's rules with, or kube-router's restore of
# the whole filter table putting back rules deleted meanwhile), and CI found 32 such rules left. Its chains: the Kubernetes ones (kube_chain_ours), the CNI
# plugins' CNI-<hash> chains that its network's rules jump to, and the firewall plugin's shared
# CNI-FORWARD and CNI-ADMIN when they came after the record and nothing else is left in them.
our_iptables_ops() {
  local ipt="$1" table="$2" save chain ours=" " cni_hash
  save="$("${ipt}-save" -t "$table" 2>/dev/null)" || return 0
  cni_hash=" $(grep -F -- "$CNI_COMMENT" <<<"$save" | grep -oE -- '-j CNI-[0-9a-f]{24}' | cut -c4- | sort -u | tr '\n' ' ') "
  while read -r chain; do
    case "$chain" in
    KUBE-*) kube_chain_ours "$chain" "$ipt" "$table" && ours+="${chain} " ;;
    CNI-FORWARD | CNI-ADMIN) ;; # decided below, once the rules to go are known
    CNI-*)
      if [[ "$cni_hash" == *" ${chain} "* ]] && ! recorded "chains.${ipt}.${table}" "$chain"; then ours+="${chain} "; fi
      ;;
    esac
  done < <(sed -n 's/^:\([^ ]*\) .*/\1/p' <<<"$save")
  local shared=" "
  for chain in CNI-FORWARD CNI-ADMIN; do
    recorded "chains.${ipt}.${table}" "$chain" || shared+="${chain} "
  done
  # The comment through the environment: awk -v would read its backslashes as escapes.
  CNI_COMMENT="$CNI_COMMENT" awk -v ours="$ours" -v shared="$shared" -v cidr="$POD_CIDR" '
    function ip2int(s,   p) { split(s, p, "."); return ((p[1] * 256 + p[2]) * 256 + p[3]) * 256 + p[4] }
    function in_pods(a,   len, net) {
      sub(/\/32$/, "", a)
      if (a !~ /^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$/) return 0
      net = cidr; len = net; sub(/\/.*/, "", net); sub(/.*\//, "", len)
      return int(ip2int(a) / 2 ^ (32 - len)) == int(ip2int(net) / 2 ^ (32 - len))
    }
    BEGIN { comment = ENVIRON["CNI_COMMENT"] }
    /^-A / {
      chain = $2
      if (index(ours, " " chain " ")) next # flushed with its chain
      mine = index($0, comment) > 0
      for (i = 3; i < NF; i++) if (($i == "-j" || $i == "-g") && index(ours, " " $(i + 1) " ")) mine = 1
      if (!mine && chain == "CNI-FORWARD")
        for (i = 3; i < NF; i++) if (($i == "-d" || $i == "-s") && in_pods($(i + 1))) mine = 1
      if (mine) { sub(/^-A /, "-D "); del[++n] = $0 }
      else if (chain == "CNI-FORWARD" && !($0 ~ / -j CNI-ADMIN$/)) fwd_kept = 1
      else if (chain == "CNI-ADMIN") admin_kept = 1
      else if (chain != "CNI-FORWARD")
        for (i = 3; i < NF; i++) if ($i == "-j" && $(i + 1) == "CNI-FORWARD") { sub(/^-A /, "-D "); jumps[++m] = $0 }
      next
    }
    /^:/ { name = substr($1, 2); present[name] = 1 }
    END {
      for (i = 1; i <= n; i++) print del[i]
      # The firewall plugin adds CNI-FORWARD (a jump from FORWARD) and CNI-ADMIN; each goes when
      # it came after the record and nothing of another network is left in it.
      fwd = present["CNI-FORWARD"] && index(shared, " CNI-FORWARD ") && !fwd_kept
      if (fwd) {
        for (i = 1; i <= m; i++) print jumps[i]
        print "-F CNI-FORWARD"
      }
      admin = fwd && present["CNI-ADMIN"] && index(shared, " CNI-ADMIN ") && !admin_kept
      split(ours, o, " ")
      for (k in o) print "-F " o[k]
      for (k in o) print "-X " o[k]
      if (fwd) print "-X CNI-FORWARD"
      if (admin) print "-X CNI-ADMIN"
    }' <<<"$save"
}

# remove_our_iptables: the cluster's rules and chains, table by table, in one iptables-restore
# transaction each (--noflush: nothing else is touched); where the transaction fails (a rule
# changed meanwhile), line by line, each in its own. RAN_KUBE_ROUTER (0/1) comes from the caller.
remove_our_iptables() {
  local ipt table ops line
  FOREIGN_KUBE="$(neighbour_kubernetes_process || true)"
  [[ -z "$FOREIGN_KUBE" ]] ||
    say "another Kubernetes runs here (${FOREIGN_KUBE}): the kubelet's and kube-proxy's chains stay (their names are the same for both)"
  for ipt in iptables ip6tables; do
    command -v "${ipt}-restore" >/dev/null 2>&1 || continue
    for table in nat filter mangle raw; do
      ops="$(our_iptables_ops "$ipt" "$table")"
      [[ -n "$ops" ]] || continue
      printf '*%s\n%s\nCOMMIT\n' "$table" "$ops" | "${ipt}-restore" -w --noflush 2>/dev/null && continue
      while IFS= read -r line; do
        printf '*%s\n%s\nCOMMIT\n' "$table" "$line" | "${ipt}-restore" -w --noflush 2>/dev/null || true
      done <<<"$ops"
    done
  done
}

# shared_netns_dir: before the first pod's namespace is mounted in NETNS_DIR, make it a mount
# point of its own, shared, as iproute2's `ip netns add` does the first time it runs. Otherwise a
# neighbour's first `ip netns add` while the cluster runs bind-mounts the folder over itself and
# hides the pods' namespace mounts beneath it: each then fails to delete ("Device or resource
# busy"). Left alone when it is a mount point already, or when something is mounted in it (that
# bind mount would hide those mounts from their owner); cluster-down undoes it when it made it.
shared_netns_dir() {
  mkdir -p "$NETNS_DIR"
  mountpoint -q "$NETNS_DIR" && return 0
  [[ -z "$(mounts_under "$NETNS_DIR")" ]] || return 0
  mount --bind "$NETNS_DIR" "$NETNS_DIR" && mount --make-rshared "$NETNS_DIR" &&
    printf '%s\n' "$NETNS_DIR" >"${STATE}/netns-dir-mounted"
}

# mounts_under DIR: the mount points below DIR (not DIR itself), one a line, each as often as it
# is mounted there (a stacked mount is listed once per layer).
mounts_under() {
  awk -v d="$1/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo
}

# netns_mounted PATH: PATH is a mount point in /proc/self/mountinfo, visible or hidden beneath a
# mount of its folder.
netns_mounted() {
  awk -v p="$1" '$5 == p {found = 1} END {exit !found}' /proc/self/mountinfo
}

# unmount_all PATH: every mount of PATH that can be reached from here, top first.
unmount_all() {
  local i
  for ((i = 0; i < 8; i++)); do
    netns_mounted "$1" || return 0
    umount -l "$1" 2>/dev/null || return 0
  done
}

# remove_netns NAME...: the pods' network namespaces, each with every mount of its file, then the
# file. A neighbour's first `ip netns add` while the cluster ran (over a NETNS_DIR that was no
# mount point) bind-mounted the folder over itself, recursively: each file's first mount is then
# hidden beneath that bind mount, out of reach by its path, and the file cannot be removed
# ("Device or resource busy"). For those, the bind mount is moved aside (mount --move, with the
# neighbour's namespaces on it), the hidden mounts are unmounted, and it is moved back: for that
# moment the neighbour's namespaces are not in NETNS_DIR.
remove_netns() {
  local ns hidden=() aside="${STATE}/netns-aside"
  for ns in "$@"; do
    unmount_all "${NETNS_DIR}/${ns}"
    netns_mounted "${NETNS_DIR}/${ns}" && hidden+=("$ns")
  done
  if ((${#hidden[@]})) && mountpoint -q "$NETNS_DIR" && mkdir -p "$aside" &&
    mount --move "$NETNS_DIR" "$aside"; then
    for ns in "${hidden[@]}"; do unmount_all "${NETNS_DIR}/${ns}"; done
    mount --move "$aside" "$NETNS_DIR" ||
      say "could not move ${NETNS_DIR} back from ${aside}: mount --move ${aside} ${NETNS_DIR}"
    rmdir "$aside" 2>/dev/null || true
  fi
  for ns in "$@"; do rm -f "${NETNS_DIR}/${ns}" 2>/dev/null || true; done
}

# release_netns_dir: undo shared_netns_dir's mount when cluster-up made it and nothing else is
# mounted in it now (a neighbour's namespace there keeps it).
release_netns_dir() {
  [[ -f "${STATE}/netns-dir-mounted" ]] || return 0
  if mountpoint -q "$NETNS_DIR" && [[ -z "$(mounts_under "$NETNS_DIR")" ]]; then
    umount "$NETNS_DIR" 2>/dev/null || true
  fi
}
