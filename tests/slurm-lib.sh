# shellcheck shell=bash
# What tests/test_slurm.sh and tests/test_slurm_nodes.sh share (sourced, not run).
#
#   slurm_clean_env          unsets the launchers' variables that a launcher around the
#                            test (CI on a cluster, under mpirun) or the user may have set,
#                            so that only the Slurm the test starts places its ranks
#   slurm_conf_common DIR    prints the slurm.conf lines both tests use: auth/none, root,
#                            state, spool, pid and log files under DIR (slurmd's per node,
#                            %n), no cgroups, accounting or mail

slurm_clean_env() {
    unset TUTTI_RANK TUTTI_WORLD_SIZE TUTTI_LOCAL_SIZE TUTTI_STORE TUTTI_JOB_ID RANK WORLD_SIZE \
        LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID MPI_LOCALNRANKS
    local v
    while read -r v; do unset "$v"; done < <(env | grep -o '^\(SLURM\|OMPI\|PMIX\|PMI\)_[A-Z_]*')
}

slurm_conf_common() {
    mkdir -p "$1/state" "$1/spool"
    cat <<EOC
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$1/state
SlurmdSpoolDir=$1/spool/%n
SlurmctldPidFile=$1/slurmctld.pid
SlurmdPidFile=$1/slurmd-%n.pid
SlurmctldLogFile=$1/slurmctld.log
SlurmdLogFile=$1/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
EOC
}
