/*
 * build_info.c — the receipt's "build" and "machine" (mt_build.h).
 *
 * The commit comes from gen/mt_gitinfo.h, which the CMake target mt_gitinfo
 * rewrites at every build when `git describe --dirty` changes (so a binary
 * rebuilt after an edit says "-dirty" and after a commit the new hash).
 * Builds that compile the sources without CMake (the CUDA emulator scripts
 * of tests/) have no such header and say "unknown".
 */
#define _GNU_SOURCE
#include "mt_build.h"

#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "../ops/mt_ops.h"

#if defined(__has_include)
#if __has_include("mt_gitinfo.h")
#include "mt_gitinfo.h"
#endif
#endif
#ifndef MT_GIT_DESCRIBE
#define MT_GIT_DESCRIBE "unknown (built without cmake/gitinfo.cmake)"
#endif
#ifndef MT_BUILD_TYPE
#define MT_BUILD_TYPE "unknown"
#endif

void mt_build_info(struct mt_build_info *b)
{
    memset(b, 0, sizeof *b);
    b->git = MT_GIT_DESCRIBE;
    b->build_type = MT_BUILD_TYPE;
#if defined(__clang__)
    b->compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
    b->compiler = "gcc " __VERSION__;
#else
    b->compiler = "unknown";
#endif
#ifdef MT_WITH_MPI
    b->mpi = 1;
#endif
    b->cuda = mt_ops_built("cuda");   /* the backends are the ops layer's to know (mt_ops.h) */
#ifdef MT_WITH_NCCL
    b->nccl = 1;
#endif
}

void mt_machine_info(struct mt_machine_info *m)
{
    memset(m, 0, sizeof *m);
    if (gethostname(m->hostname, sizeof m->hostname - 1) != 0) m->hostname[0] = 0;
    struct utsname u;
    if (uname(&u) == 0) snprintf(m->os, sizeof m->os, "%s %s %s", u.sysname, u.release, u.machine);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    m->logical_cpus = n > 0 ? (int)n : 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(m->cpu_model, sizeof m->cpu_model, "%s", v);
        m->cpu_model[strcspn(m->cpu_model, "\n")] = 0;
        break;
    }
    fclose(f);
}
