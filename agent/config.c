/* config.c: see config.h. */
#include "agent/config.h"

#include <stdlib.h>

bool launch_rank_shown(const struct launch_config *cfg, int local_rank)
{
    if (cfg->ranks_filter == NULL)
        return true;
    for (int i = 0; i < cfg->ranks_filter_len; i++) {
        if (cfg->ranks_filter[i] == local_rank)
            return true;
    }
    return false;
}

void launch_config_free(struct launch_config *cfg)
{
    free(cfg->rdzv_conf);
    free(cfg->rdzv_conf_buf);
    free(cfg->ranks_filter);
    free(cfg->program);
    free(cfg->argv);
    free(cfg->auto_progress_dir);
    cfg->auto_progress_dir = NULL;
    for (int i = 0; i < 2; i++) {
        free(cfg->dup_filters[i]);
        free(cfg->dup_filters_buf[i]);
        cfg->dup_filters[i] = NULL;
        cfg->dup_filters_buf[i] = NULL;
    }
    cfg->rdzv_conf = NULL;
    cfg->rdzv_conf_buf = NULL;
    cfg->ranks_filter = NULL;
    cfg->program = NULL;
    cfg->argv = NULL;
}
