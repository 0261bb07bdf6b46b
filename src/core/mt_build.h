/*
 * mt_build.h — which binary this is and which machine runs it, for the
 * receipt ("build" and "machine"): a number is only comparable with another
 * when both say what produced them.
 */
#ifndef MT_BUILD_H
#define MT_BUILD_H

struct mt_build_info {
    const char *git;          /* `git describe --always --dirty` of the tree at build time,
                                 "unknown (...)" outside a checkout or a CMake build */
    const char *build_type;   /* CMAKE_BUILD_TYPE, e.g. "RelWithDebInfo"                    */
    const char *compiler;     /* the C compiler's version string                            */
    int mpi, cuda, nccl;      /* compiled in (MT_WITH_MPI, the cuda backend: mt_ops_built, MT_WITH_NCCL) */
};
void mt_build_info(struct mt_build_info *b);

struct mt_machine_info {
    char hostname[256];
    char cpu_model[256];      /* /proc/cpuinfo "model name" of the first CPU, "" if unknown */
    char os[256];             /* uname: sysname release machine                            */
    int  logical_cpus;        /* online logical CPUs (sysconf)                             */
};
void mt_machine_info(struct mt_machine_info *m);

#endif
