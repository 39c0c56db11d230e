#!/usr/bin/env bash
# A one-node SLURM cluster on this (Debian 12, root) machine, to run `paczero sweep --slurm` for real and
# the gated test: PACZERO_TEST_SLURM_PARTITION=cpu python -m pytest tests/test_sweep.py -k real_slurm
# (SLURM 22.05.8 from Debian, submitit 1.5.4; run on 2026-11-23).
set -euo pipefail
DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm >/dev/null
host=$(hostname)
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=paczerotest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$(nproc) RealMemory=$(( $(free -m | awk '/Mem:/ {print $2}') - 2000 )) State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
pgrep munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged || /usr/sbin/munged --force
pgrep slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep slurmd >/dev/null || /usr/sbin/slurmd
sleep 2
sinfo
