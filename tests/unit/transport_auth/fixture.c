/* unit.transport_auth's fixture: keys, sealed messages, nn_reallocmsg wrapped, an inbox. */
#include "fixture.h"

const unsigned char KEY[32] = "chainps auth unit test job key";
const unsigned char OTHER[32] = "another job's key, not ours!!!";
int realloc_move, realloc_moved;

void *__wrap_nn_reallocmsg(void *msg, size_t size)
{
    if (!realloc_move)
        return __real_nn_reallocmsg(msg, size);
    realloc_move = 0;
    void *nb = nn_allocmsg(size, 0);
    if (!nb)
        return NULL;
    memcpy(nb, msg, size); /* only ever asked to shorten */
    /* Scribbled over before it is freed: a send of the old chunk would not be byte-exact. */
    memset(msg, 0xee, size);
    nn_freemsg(msg);
    realloc_moved++;
    return nb;
}

/* A message of BODY bytes and room for the trailer. */
unsigned char *message(uint32_t seed)
{
    unsigned char *m = malloc(BODY + CPS_AUTH_TRAILER);
    assert_non_null(m);
    for (size_t i = 0; i < BODY; i++)
        m[i] = (unsigned char)(seed * 31u + i * 7u);
    return m;
}

int open_copy(cps__auth *rx, const unsigned char *m, size_t len)
{
    size_t body = 0;
    int v = cps__auth_open(rx, m, len, &body);
    if (v == CPS_AUTH_OK)
        assert_int_equal(body, len - CPS_AUTH_TRAILER);
    return v;
}

void keep(void *ctx, void *buf, size_t len)
{
    inbox *ib = ctx;
    ib->n++;
    ib->last_len = len;
    memcpy(ib->last, buf, len < BODY ? len : BODY);
    cps__tp_free(buf);
}

uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Poll rcv (and flush snd) for up to ms; returns what was delivered. */
void pump(cps__tp *snd, cps__tp *rcv, inbox *ib, int want, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    while (ib->n < want && now_ms() < end) {
        if (snd)
            cps__tp_poll(snd, 0, NULL, NULL, 0);
        cps__tp_poll(rcv, 10, keep, ib, 0);
    }
}
