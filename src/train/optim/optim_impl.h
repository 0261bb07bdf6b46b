/*
 * optim_impl.h — the built-in optimizer classes, one file each; the table
 * in optim.c lists them in enum mt_optim_kind order.
 */
#ifndef MT_OPTIM_IMPL_H
#define MT_OPTIM_IMPL_H

#include "../mt_optim.h"

extern const struct mt_optim_i mt_optim_adamw;   /* adamw.c */
extern const struct mt_optim_i mt_optim_muon;    /* muon.c  */

#endif /* MT_OPTIM_IMPL_H */
