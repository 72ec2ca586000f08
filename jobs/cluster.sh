#!/usr/bin/env bash
# A cluster on one machine: H hosts, each a Linux network namespace with its own address on one bridge,
# and MPI jobs launched across them by MPICH's hydra (ssh launcher, with `ip netns exec` in place of ssh).
#
#   jobs/cluster.sh up H [--rate RATE] [--burst SIZE] [--slurm]
#                                                      make H hosts; RATE (e.g. 1gbit, 200mbit) shapes
#                                                      every host's link, both directions (tbf); --slurm
#                                                      starts Slurm on them (slurmctld, a slurmd per host)
#   jobs/cluster.sh run [-n PER_HOST] CMD...           run CMD on PER_HOST ranks of every host (default 1)
#   jobs/cluster.sh mpiexec ARGS...                    hydra's mpiexec through the bed with your placement,
#                                                      e.g. -hosts 10.X.Y.1:2,10.X.Y.3:2 -n 4 CMD (the
#                                                      launcher `scaffe elastic --launcher` drives)
#   jobs/cluster.sh status                             hosts, addresses, link rate, processes left
#   jobs/cluster.sh kill                               kill what runs in the hosts, keep them
#   jobs/cluster.sh down                               kill what runs in the hosts, remove everything
#
# Runs as root. SCAFFE_BED names the bed (default scbed; up to 8 letters or digits): its namespaces are
# NAMEh1..NAMEhH, its bridge NAMEbr, its veths NAMEv1..NAMEvH, so beds of different names never meet.
# The subnet is 10.X.Y.0/24 derived from the name (SCAFFE_BED_NET=10.X.Y overrides); the bridge is .254.
# `run` uses $MPIEXEC, else the active virtualenv's mpiexec, else the repository's .venv, else PATH's; it
# must be hydra's. UCX (MPICH's transport) sees one kernel and would move traffic between namespaces
# through shared memory, so what runs in a host gets UCX_TLS=self,tcp to make it cross the link, and
# UCX_TCP_RX_SEG_SIZE=1m so that a rank that naps between its Tests (SCAFFE_WAIT=nap) still drains its
# socket at the link's rate: UCX reads one segment a progress call, 64 KiB by default (perf/RESULTS.md, "A
# napping rank's receives"); either unless the launching environment sets it.
# Each host has its own memory too: what runs in it sees /dev/shm/scaffe-bed-NAME/NAMEhK as its /dev/shm (a
# bind mount in the mount namespace `ip netns exec` makes), so what one host keeps there the others do not see.
# With --slurm, `status` prints the SLURM_CONF under which srun, sbatch and sinfo reach the bed's Slurm.
# Exit codes: 0 done, 1 failed, 2 usage, 3 this machine cannot host a bed (not root, no ip, no netns,
# or for --slurm no Slurm that starts).
set -Eeuo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bed=${SCAFFE_BED:-scbed}
state=/run/scaffe-bed/$bed
memories=/dev/shm/scaffe-bed-$bed  # the hosts' /dev/shm, one folder each
bridge=${bed}br

die() { echo "cluster.sh: $2" >&2; exit "$1"; }
usage() { sed -n '5,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[[ $bed =~ ^[a-z][a-z0-9]{0,7}$ ]] || die 2 "SCAFFE_BED=$bed: give 1 to 8 lower-case letters or digits, starting with a letter"
[[ $(id -u) == 0 ]] || die 3 "must run as root (namespaces, veths and bridges need CAP_NET_ADMIN)"
command -v ip >/dev/null || die 3 "no 'ip' command here (install iproute2)"

subnet() {
    if [[ -n ${SCAFFE_BED_NET:-} ]]; then
        [[ $SCAFFE_BED_NET =~ ^10\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die 2 "SCAFFE_BED_NET=$SCAFFE_BED_NET: give 10.X.Y"
        echo "$SCAFFE_BED_NET"
        return
    fi
    local sum
    sum=$(printf %s "$bed" | cksum | cut -d' ' -f1)
    echo "10.$((100 + sum % 100)).$(((sum / 100) % 256))"
}

# Namespaces of this bed that exist now, found by name so that `down` also clears a half-made bed.
bed_namespaces() { ip netns list | awk '{print $1}' | grep -E "^${bed}h[0-9]+$" || true; }

kill_namespace_processes() {
    local ns=$1 pids tries=0
    while pids=$(ip netns pids "$ns" 2>/dev/null) && [[ -n $pids ]]; do
        ((tries++ < 100)) || die 1 "processes $pids in namespace $ns survive SIGKILL"
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
}

kill_all() {
    local ns
    for ns in $(bed_namespaces); do kill_namespace_processes "$ns"; done
}

bed_veths() { ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${bed}v[0-9]+$" || true; }

down() {
    local ns veth veths tries=0
    kill_all
    for ns in $(bed_namespaces); do ip netns delete "$ns"; done
    # The kernel removes a deleted namespace's veths a little later; wait, so that an `up` of the
    # same name can follow at once (and delete those left by an `up` that stopped half-way).
    while veths=$(bed_veths) && [[ -n $veths ]]; do
        ((tries++ < 100)) || die 1 "veths $veths of bed $bed do not go away"
        for veth in $veths; do ip link delete "$veth" 2>/dev/null || true; done
        sleep 0.1
    done
    if ip link show "$bridge" >/dev/null 2>&1; then ip link delete "$bridge"; fi
    stop_slurmctld
    rm -rf "$state" "$memories"
}

stop_slurmctld() {
    local pidfile=$state/slurm/slurmctld.pid pid tries=0
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || return 0
    while kill -0 "$pid" 2>/dev/null; do
        ((tries++ < 100)) || { kill -KILL "$pid" 2>/dev/null || true; break; }
        sleep 0.1
    done
}

# Slurm on the hosts: slurmctld in the machine's own namespace on the bridge address, a slurmd per host.
# auth/none lets any local user act as any other: fit for a bed on one machine, never for a cluster.
slurm_up() {
    local hosts=$1 net=$2 dir=$state/slurm i ns port cgroup_plugin=cgroup/v1 tries=0
    port=$((20000 + $(printf %s "$bed" | cksum | cut -d' ' -f1) % 10000))
    [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]] && cgroup_plugin=cgroup/v2
    mkdir -p "$dir/ctld"
    {
        echo "ClusterName=$bed"
        echo "SlurmctldHost=$(uname -n | cut -d. -f1)($net.254)"
        echo "SlurmctldPort=$port"
        echo "AuthType=auth/none"
        echo "CredType=cred/none"
        echo "SlurmUser=root"
        echo "StateSaveLocation=$dir/ctld"
        echo "SlurmctldPidFile=$dir/slurmctld.pid"
        echo "SlurmctldLogFile=$dir/slurmctld.log"
        echo "SlurmdSpoolDir=$dir/%n"
        echo "SlurmdPidFile=$dir/%n.pid"
        echo "SlurmdLogFile=$dir/%n.log"
        echo "SlurmdParameters=config_overrides"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "SelectType=select/cons_tres"
        echo "MpiDefault=pmi2"
        echo "ReturnToService=2"
        echo "MailProg=/bin/true"
        for ((i = 1; i <= hosts; i++)); do
            echo "NodeName=${bed}h$i NodeAddr=$net.$i CPUs=$(nproc) State=UNKNOWN"
        done
        echo "PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$dir/slurm.conf"
    echo "CgroupPlugin=$cgroup_plugin" >"$dir/cgroup.conf"
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -i || true  # as for slurmd
    for ((i = 1; i <= hosts; i++)); do
        ns=${bed}h$i
        mkdir -p "$dir/$ns"
        "$state/enter" "$ns" "slurmd -N $ns" || true  # its log says why, read below
    done
    until [[ $(sinfo -h -o %T 2>/dev/null | sort -u) == idle ]]; do
        if ((tries++ > 150)); then
            local why
            why=$(grep -h "error" "$dir"/*.log 2>/dev/null | tail -n 1)
            down
            die 3 "Slurm does not start on bed $bed: ${why:-no idle nodes after 30 s}"
        fi
        sleep 0.2
    done
}

# tbf's bucket must hold what the link sends in a timer tick (4 ms at HZ=250), and at least a few
# 64 KiB segments that veth's offloads hand it, or it shapes below the asked rate.
default_burst() {
    [[ $1 =~ ^([0-9]+)([kmg]?)bit$ ]] || die 2 "--rate $1: give a rate like 1gbit, 200mbit or 500kbit"
    local bits=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in k) bits=$((bits * 1000)) ;; m) bits=$((bits * 1000000)) ;; g) bits=$((bits * 1000000000)) ;; esac
    local bytes=$((bits / 8 / 250))
    echo $((bytes > 262144 ? bytes : 262144))
}

shape() {  # shape DEVICE [netns]: tbf on the egress of DEVICE
    local dev=$1 ns=${2:-}
    ip ${ns:+-n "$ns"} link set "$dev" up
    [[ -n $rate ]] || return 0
    if [[ -n $ns ]]; then
        ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
    else
        tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
    fi
}

up() {
    local hosts=${1:-}
    [[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 1 && hosts <= 99)) || usage
    shift
    local rate="" burst="" slurm=no command
    while (($#)); do
        case $1 in
            --rate) rate=${2:?--rate needs a value}; shift 2 ;;
            --burst) burst=${2:?--burst needs a value}; shift 2 ;;
            --slurm) slurm=yes; shift ;;
            *) usage ;;
        esac
    done
    if [[ -n $rate ]]; then
        command -v tc >/dev/null || die 3 "--rate needs 'tc' (install iproute2)"
        [[ -n $burst ]] || burst=$(default_burst "$rate")
    fi
    if [[ $slurm == yes ]]; then
        for command in slurmctld slurmd sinfo srun; do
            command -v $command >/dev/null || die 3 "--slurm needs $command (Debian: apt-get install slurm-wlm)"
        done
    fi
    local net config
    net=$(subnet)
    config="hosts=$hosts net=$net rate=${rate:-none} burst=${burst:-none} slurm=$slurm"
    if [[ -f $state/config && $(cat "$state/config") == "$config" && $(bed_namespaces | wc -l) == "$hosts" ]]; then
        echo "bed $bed is already up: $config"
        return 0
    fi
    down
    local route
    route=$(ip -4 route show "$net.0/24")
    [[ -z $route ]] || die 1 "subnet $net.0/24 is already routed here ($route); set SCAFFE_BED_NET=10.X.Y or SCAFFE_BED"
    trap 'down' ERR
    mkdir -p "$state"
    ip link add "$bridge" type bridge 2>/dev/null || { trap - ERR; down; die 3 "cannot create bridge $bridge (kernel without bridges, or no CAP_NET_ADMIN)"; }
    ip addr add "$net.254/24" dev "$bridge"
    ip link set "$bridge" up
    local i ns cases=""
    for ((i = 1; i <= hosts; i++)); do
        ns=${bed}h$i
        ip netns add "$ns" 2>/dev/null || { trap - ERR; down; die 3 "cannot create network namespace $ns (a container without CAP_SYS_ADMIN?)"; }
        ip -n "$ns" link set lo up
        ip link add "${bed}v$i" type veth peer name eth0 netns "$ns"
        ip link set "${bed}v$i" master "$bridge"
        shape "${bed}v$i"
        ip -n "$ns" addr add "$net.$i/24" dev eth0
        shape eth0 "$ns"
        echo "$net.$i $ns" >>"$state/hosts"
        mkdir -p "$memories/$ns"
        cases+="    $net.$i) ns=$ns ;;"$'\n'
    done
    # `enter NS COMMAND` runs the shell command COMMAND in host NS: its network namespace and its memory, and
    # the bed's transport settings where COMMAND's environment has none (the usage above).
    cat >"$state/enter" <<EOF
#!/bin/sh
ns=\$1
shift
export UCX_TLS="\${UCX_TLS:-self,tcp}" UCX_TCP_RX_SEG_SIZE="\${UCX_TCP_RX_SEG_SIZE:-1m}"
exec ip netns exec "\$ns" /bin/sh -c 'mount --bind "\$0" /dev/shm && exec /bin/sh -c "\$1"' "$memories/\$ns" "\$*"
EOF
    # hydra's ssh launcher calls this with [ssh options] HOST COMMAND...; like sshd, run the command
    # through a shell (hydra quotes its arguments for one), here inside the host.
    cat >"$state/launch" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
case \$1 in
$cases    *) echo "cluster.sh launcher: \$1 is not a host of bed $bed" >&2; exit 255 ;;
esac
shift
exec "$state/enter" "\$ns" "\$*"
EOF
    chmod +x "$state/enter" "$state/launch"
    trap - ERR
    [[ $slurm == no ]] || slurm_up "$hosts" "$net"
    echo "$config" >"$state/config"
    echo "bed $bed is up: $config"
}

find_mpiexec() {
    local candidate
    for candidate in "${MPIEXEC:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/mpiexec}" "$repo/.venv/bin/mpiexec" "$(command -v mpiexec || true)"; do
        [[ -n $candidate && -x $candidate ]] || continue
        [[ $("$candidate" --version 2>/dev/null) == *HYDRA* ]] ||
            die 1 "$candidate is not MPICH's hydra mpiexec (the bed launches through its -launcher-exec); set MPIEXEC"
        echo "$candidate"
        return
    done
    die 1 "no mpiexec found (set MPIEXEC, activate the virtualenv, or make .venv: see README)"
}

run() {
    local per_host=1
    if [[ ${1:-} == -n ]]; then
        per_host=${2:?-n needs a number}
        shift 2
    fi
    [[ $per_host =~ ^[1-9][0-9]*$ ]] || die 2 "-n $per_host: give a number of ranks per host"
    (($#)) || usage
    [[ -f $state/hosts ]] || die 1 "bed $bed is not up (jobs/cluster.sh up H)"
    local hosts count
    hosts=$(awk -v n="$per_host" '{printf "%s%s:%d", (NR > 1 ? "," : ""), $1, n}' "$state/hosts")
    count=$(($(wc -l <"$state/hosts") * per_host))
    bed_mpiexec -hosts "$hosts" -n "$count" "$@"
}

bed_mpiexec() {  # hydra with the bed's launcher and bridge; the arguments say where and what
    (($#)) || usage
    [[ -f $state/hosts ]] || die 1 "bed $bed is not up (jobs/cluster.sh up H)"
    local mpiexec
    mpiexec=$(find_mpiexec)
    exec "$mpiexec" -launcher ssh -launcher-exec "$state/launch" -iface "$bridge" "$@"
}

status() {
    if [[ ! -f $state/config ]]; then
        echo "bed $bed is down"
        [[ -z $(bed_namespaces) ]] || echo "  but namespaces are left: $(bed_namespaces | xargs); run down"
        return 0
    fi
    echo "bed $bed: $(cat "$state/config"), bridge $bridge"
    local addr ns
    while read -r addr ns; do
        echo "  $ns $addr: $(ip netns pids "$ns" 2>/dev/null | wc -l) process(es)"
    done <"$state/hosts"
    [[ ! -f $state/slurm/slurm.conf ]] || echo "  Slurm: export SLURM_CONF=$state/slurm/slurm.conf UCX_TLS=self,tcp"
}

command=${1:-}
shift || true
case $command in
    up) up "$@" ;;
    run) run "$@" ;;
    mpiexec) bed_mpiexec "$@" ;;
    down) (($# == 0)) || usage; down; echo "bed $bed is down" ;;
    status) status ;;
    kill) (($# == 0)) || usage; kill_all ;;
    *) usage ;;
esac
