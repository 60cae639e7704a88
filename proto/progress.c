/*
 * progress.c: see progress.h.
 *
 * The line parser is a small JSON recogniser rather than cJSON because
 * Python's json.dumps writes NaN and Infinity for a diverged loss, which
 * cJSON (rightly, for JSON) refuses; a training script that reports its loss
 * must not go silent exactly when the loss goes bad. It accepts RFC 8259 plus
 * those three tokens, decodes only the known fields and skips the rest.
 */
#include "proto/progress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/jsonw.h"

struct cursor {
    const char *s;
    size_t n;
    size_t i;
};

static int peek(const struct cursor *c)
{
    return c->i < c->n ? (unsigned char)c->s[c->i] : -1;
}

static void skip_ws(struct cursor *c)
{
    while (c->i < c->n) {
        char ch = c->s[c->i];
        if (ch != ' ' && ch != '\t' && ch != '\r' && ch != '\n')
            break;
        c->i++;
    }
}

static bool take_word(struct cursor *c, const char *w)
{
    size_t len = strlen(w);
    if (c->n - c->i < len || memcmp(c->s + c->i, w, len) != 0)
        return false;
    c->i += len;
    return true;
}

static bool is_hex(int ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* A string; on success [*start, *end) are its raw bytes between the quotes. */
static int parse_string(struct cursor *c, size_t *start, size_t *end)
{
    if (peek(c) != '"')
        return CDDP_EPARSE;
    c->i++;
    *start = c->i;
    while (c->i < c->n) {
        unsigned char ch = (unsigned char)c->s[c->i];
        if (ch == '"') {
            *end = c->i;
            c->i++;
            return 0;
        }
        if (ch < 0x20)
            return CDDP_EPARSE;
        if (ch == '\\') {
            c->i++;
            int e = peek(c);
            if (e == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (c->i + k >= c->n || !is_hex((unsigned char)c->s[c->i + k]))
                        return CDDP_EPARSE;
                c->i += 4;
            } else if (e < 0 || strchr("\"\\/bfnrt", e) == NULL) {
                return CDDP_EPARSE;
            }
        }
        c->i++;
    }
    return CDDP_EPARSE;
}

static bool is_digit(int ch)
{
    return ch >= '0' && ch <= '9';
}

/* A JSON number, or NaN / Infinity / -Infinity (Python's json module). */
static int parse_number(struct cursor *c, double *out)
{
    if (take_word(c, "NaN")) {
        *out = NAN;
        return 0;
    }
    if (take_word(c, "Infinity")) {
        *out = INFINITY;
        return 0;
    }
    if (take_word(c, "-Infinity")) {
        *out = -INFINITY;
        return 0;
    }
    size_t start = c->i;
    if (peek(c) == '-')
        c->i++;
    if (peek(c) == '0') {
        c->i++;
    } else if (is_digit(peek(c))) {
        while (is_digit(peek(c)))
            c->i++;
    } else {
        return CDDP_EPARSE;
    }
    if (peek(c) == '.') {
        c->i++;
        if (!is_digit(peek(c)))
            return CDDP_EPARSE;
        while (is_digit(peek(c)))
            c->i++;
    }
    if (peek(c) == 'e' || peek(c) == 'E') {
        c->i++;
        if (peek(c) == '+' || peek(c) == '-')
            c->i++;
        if (!is_digit(peek(c)))
            return CDDP_EPARSE;
        while (is_digit(peek(c)))
            c->i++;
    }
    char tmp[64];
    size_t len = c->i - start;
    if (len >= sizeof(tmp))
        return CDDP_EPARSE;
    memcpy(tmp, c->s + start, len);
    tmp[len] = '\0';
    *out = strtod(tmp, NULL); /* the grammar above is a subset of strtod's */
    return 0;
}

static int skip_value(struct cursor *c, int depth);

static int skip_container(struct cursor *c, int depth, char close, bool object)
{
    if (depth >= PROGRESS_MAX_DEPTH)
        return CDDP_EPARSE;
    c->i++; /* the opening bracket */
    skip_ws(c);
    if (peek(c) == close) {
        c->i++;
        return 0;
    }
    for (;;) {
        int rc;
        if (object) {
            size_t a, b;
            if ((rc = parse_string(c, &a, &b)))
                return rc;
            skip_ws(c);
            if (peek(c) != ':')
                return CDDP_EPARSE;
            c->i++;
            skip_ws(c);
        }
        if ((rc = skip_value(c, depth + 1)))
            return rc;
        skip_ws(c);
        int ch = peek(c);
        c->i++;
        if (ch == close)
            return 0;
        if (ch != ',')
            return CDDP_EPARSE;
        skip_ws(c);
    }
}

static int skip_value(struct cursor *c, int depth)
{
    size_t a, b;
    double d;
    switch (peek(c)) {
    case '{':
        return skip_container(c, depth, '}', true);
    case '[':
        return skip_container(c, depth, ']', false);
    case '"':
        return parse_string(c, &a, &b);
    case 't':
        return take_word(c, "true") ? 0 : CDDP_EPARSE;
    case 'f':
        return take_word(c, "false") ? 0 : CDDP_EPARSE;
    case 'n':
        return take_word(c, "null") ? 0 : CDDP_EPARSE;
    default:
        return parse_number(c, &d);
    }
}

enum key {
    KEY_OTHER,
    KEY_STEP,
    KEY_EPOCH,
    KEY_LOSS,
    KEY_SPS,
    KEY_STEP_TIME,
    KEY_COMPUTE,
    KEY_WAIT,
    KEY_AUTO,
    KEY_BLAME,
    KEY_BLAME_GEN,
};

static enum key key_of(const char *k, size_t len)
{
    static const struct {
        const char *name;
        enum key key;
    } known[] = {
        {"step", KEY_STEP},
        {"epoch", KEY_EPOCH},
        {"loss", KEY_LOSS},
        {"samples_per_s", KEY_SPS},
        {"step_time_s", KEY_STEP_TIME},
        {"compute_s", KEY_COMPUTE},
        {"wait_s", KEY_WAIT},
        {"auto", KEY_AUTO},
        {"blame", KEY_BLAME},
        {"blame_gen", KEY_BLAME_GEN},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strlen(known[i].name) == len && memcmp(known[i].name, k, len) == 0)
            return known[i].key;
    return KEY_OTHER;
}

/* Integers up to 2^53 are exact in the double the number was read into. */
static int to_count(double d, int64_t *out)
{
    if (!isfinite(d) || d < 0 || d > 9007199254740992.0 || d != floor(d))
        return CDDP_EPARSE;
    *out = (int64_t)d;
    return 0;
}

/* A finite number >= 0 for a field of time or rate. */
static int to_nonneg(double d, double *out)
{
    if (!isfinite(d) || d < 0)
        return CDDP_EPARSE;
    *out = d;
    return 0;
}

static int parse_member(struct cursor *c, struct progress_report *r, unsigned *fields,
                        bool *is_auto)
{
    size_t ks, ke;
    int rc = parse_string(c, &ks, &ke);
    if (rc)
        return rc;
    skip_ws(c);
    if (peek(c) != ':')
        return CDDP_EPARSE;
    c->i++;
    skip_ws(c);
    enum key key = key_of(c->s + ks, ke - ks);
    if (key == KEY_OTHER)
        return skip_value(c, 1);
    if (take_word(c, "null")) /* Python's None: not reported this time */
        return 0;
    if (key == KEY_AUTO) {
        if (take_word(c, "true"))
            *is_auto = true;
        else if (take_word(c, "false"))
            *is_auto = false;
        else
            return CDDP_EPARSE;
        return 0;
    }
    double d;
    if ((rc = parse_number(c, &d)))
        return rc;
    switch (key) {
    case KEY_STEP:
        rc = to_count(d, &r->step);
        *fields |= PROGRESS_STEP;
        break;
    case KEY_EPOCH:
        rc = to_count(d, &r->epoch);
        *fields |= PROGRESS_EPOCH;
        break;
    case KEY_LOSS:
        r->loss = d;
        *fields |= PROGRESS_LOSS;
        break;
    case KEY_SPS:
        rc = to_nonneg(d, &r->samples_per_s);
        *fields |= PROGRESS_SAMPLES_PER_S;
        break;
    case KEY_STEP_TIME:
        rc = to_nonneg(d, &r->step_time_s);
        *fields |= PROGRESS_STEP_TIME;
        break;
    case KEY_COMPUTE:
        rc = to_nonneg(d, &r->compute_s);
        *fields |= PROGRESS_COMPUTE;
        break;
    case KEY_WAIT:
        rc = to_nonneg(d, &r->wait_s);
        *fields |= PROGRESS_WAIT;
        break;
    case KEY_BLAME:
        rc = to_count(d, &r->blame);
        *fields |= PROGRESS_BLAME;
        break;
    case KEY_BLAME_GEN:
        rc = to_count(d, &r->blame_gen);
        *fields |= PROGRESS_BLAME_GEN;
        break;
    case KEY_AUTO:
    case KEY_OTHER:
        break;
    }
    return rc;
}

int progress_parse_line(const char *line, size_t len, struct progress_report *out, unsigned *fields,
                        bool *is_auto)
{
    struct cursor c = {line, len, 0};
    struct progress_report r = *out;
    unsigned f = 0;
    bool a = false;
    skip_ws(&c);
    if (peek(&c) != '{')
        return CDDP_EPARSE;
    c.i++;
    skip_ws(&c);
    if (peek(&c) == '}') {
        c.i++;
    } else {
        for (;;) {
            int rc = parse_member(&c, &r, &f, &a);
            if (rc)
                return rc;
            skip_ws(&c);
            int ch = peek(&c);
            c.i++;
            if (ch == '}')
                break;
            if (ch != ',')
                return CDDP_EPARSE;
            skip_ws(&c);
        }
    }
    skip_ws(&c);
    if (c.i != c.n)
        return CDDP_EPARSE;
    *out = r;
    *fields = f;
    *is_auto = a;
    return 0;
}

void progress_init(struct progress_parser *p)
{
    memset(&p->report, 0, sizeof(p->report));
    p->len = 0;
    p->overflowing = false;
    p->buf[0] = '\0';
}

void progress_restart(struct progress_parser *p)
{
    struct progress_report kept = p->report;
    progress_init(p);
    p->report.lines = kept.lines;
    p->report.malformed = kept.malformed;
    p->report.blames = kept.blames;
    memcpy(p->report.blame_ranks, kept.blame_ranks, sizeof(kept.blame_ranks));
    memcpy(p->report.blame_gens, kept.blame_gens, sizeof(kept.blame_gens));
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

static unsigned take_line(struct progress_parser *p, const char *line, size_t len,
                          uint64_t now_mono_ms, double now_wall)
{
    if (blank(line, len))
        return 0;
    struct progress_report *r = &p->report;
    /* Parsed into a copy: an "auto" line the script's own lines have
     * replaced must leave every field as it was. */
    struct progress_report next = *r;
    unsigned fields;
    bool is_auto;
    if (progress_parse_line(line, len, &next, &fields, &is_auto) != 0) {
        r->malformed++;
        return 0;
    }
    if (is_auto && r->own)
        return 0; /* the script reports for itself: the hook stands aside */
    int64_t old_step = r->step;
    bool had_step = (r->fields & PROGRESS_STEP) != 0;
    if (!is_auto && !r->own) {
        /* The script's first line: the hook's values give way to its own. */
        next.own = true;
        next.fields = 0;
        had_step = false;
    }
    *r = next;
    r->from_auto = is_auto;
    r->fields |= fields;
    r->lines++;
    if (fields & PROGRESS_BLAME) {
        if (!(fields & PROGRESS_BLAME_GEN))
            r->blame_gen = 0;
        r->blame_ranks[r->blames % PROGRESS_BLAMES_KEPT] = r->blame;
        r->blame_gens[r->blames % PROGRESS_BLAMES_KEPT] = r->blame_gen;
        r->blames++;
    }
    r->mono_ms = now_mono_ms;
    r->wall = now_wall;
    if ((fields & PROGRESS_STEP) && (!had_step || r->step != old_step))
        r->step_mono_ms = now_mono_ms;
    return 1;
}

unsigned progress_feed(struct progress_parser *p, const char *data, size_t n, uint64_t now_mono_ms,
                       double now_wall)
{
    unsigned valid = 0;
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t take = nl ? (size_t)(nl - data) : n;
        if (!p->overflowing) {
            if (take > PROGRESS_LINE_MAX - p->len) {
                p->overflowing = true;
                p->len = 0;
            } else {
                memcpy(p->buf + p->len, data, take);
                p->len += take;
            }
        }
        if (nl == NULL)
            break;
        if (p->overflowing) {
            p->report.malformed++;
            p->overflowing = false;
        } else {
            valid += take_line(p, p->buf, p->len, now_mono_ms, now_wall);
        }
        p->len = 0;
        data += take + 1;
        n -= take + 1;
    }
    return valid;
}

unsigned progress_eof(struct progress_parser *p, uint64_t now_mono_ms, double now_wall)
{
    unsigned valid = 0;
    if (p->overflowing)
        p->report.malformed++;
    else if (p->len > 0)
        valid = take_line(p, p->buf, p->len, now_mono_ms, now_wall);
    p->len = 0;
    p->overflowing = false;
    return valid;
}

int progress_format_line(struct cddp_buf *out, const struct progress_line *l)
{
    struct jsonw w;
    jsonw_init(&w, out);
    jsonw_object_begin(&w, NULL);
    jsonw_int(&w, "step", l->step);
    jsonw_int(&w, "epoch", l->epoch);
    jsonw_number_digits(&w, "loss", isfinite(l->loss) ? l->loss : 0.0, 6);
    jsonw_number_fixed(&w, "samples_per_s", l->samples_per_s, 3);
    if (l->step_time_s >= 0)
        jsonw_number_fixed(&w, "step_time_s", l->step_time_s, 6);
    if (l->compute_s >= 0)
        jsonw_number_fixed(&w, "compute_s", l->compute_s, 6);
    if (l->wait_s >= 0)
        jsonw_number_fixed(&w, "wait_s", l->wait_s, 6);
    jsonw_object_end(&w);
    int rc = jsonw_finish(&w);
    return rc ? rc : cddp_buf_append(out, "\n", 1);
}
