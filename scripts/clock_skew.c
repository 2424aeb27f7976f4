/* A wall clock off by SOAK_CLOCK_SKEW_S seconds (+: ahead), for scripts/soak.py
 * --skewed-peer: loaded with LD_PRELOAD into a node and, through its environment, its
 * network process. Only reads of the wall clock move (clock_gettime of CLOCK_REALTIME
 * and CLOCK_REALTIME_COARSE, gettimeofday, time); the monotonic clocks, sleeps and
 * timers stay true, so the node's pace and timeouts are its own.
 *
 * Why not libfaketime (Debian's faketime 0.9.10): with the monotonic clocks left alone
 * (FAKETIME_DONT_FAKE_MONOTONIC=1) every time.sleep of Python 3.11 fails with EINVAL
 * (its clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) gets a wrong deadline:
 * wolfcw/libfaketime#426), which killed a node's parent watch and its stop; with them
 * faked too, threading's timed waits hang.
 *
 * Build: cc -shared -fPIC -O2 -o clock_skew.so clock_skew.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long skew_ns(void) {
    static long long ns;
    static int read;
    if (!read) {
        const char *s = getenv("SOAK_CLOCK_SKEW_S");
        ns = s ? (long long)(atof(s) * 1e9) : 0;
        read = 1;
    }
    return ns;
}

static void shift(time_t *sec, long *nsec, long long unit) {
    long long ns = (long long)*sec * 1000000000LL + (long long)*nsec * unit + skew_ns();
    *sec = (time_t)(ns / 1000000000LL);
    *nsec = (long)(ns % 1000000000LL / unit);
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(&ts->tv_sec, &ts->tv_nsec, 1);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    static int (*real)(struct timeval *restrict, void *restrict);
    if (!real)
        real = (int (*)(struct timeval *restrict, void *restrict))dlsym(RTLD_NEXT, "gettimeofday");
    int rc = real(tv, tz);
    if (rc == 0) shift(&tv->tv_sec, &tv->tv_usec, 1000);
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
