/*
 * ops.c — backend lookup that does not depend on a backend being built.
 *
 * Invariant: without MT_WITH_CUDA, mt_ops_cuda() always returns NULL and
 * says why; with it, src/ops/cuda/ provides the real mt_ops_cuda().
 */
#include "mt_ops.h"

#include <stdio.h>

#ifndef MT_WITH_CUDA
const struct mt_ops_i *mt_ops_cuda(char *why, size_t why_len)
{
    if (why && why_len) snprintf(why, why_len, "built without CUDA");
    return NULL;
}
#endif
