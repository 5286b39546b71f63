/* guard.c - reading a mapped source safely.
 *
 * A page of a mapping that lies past the end of a file truncated by another
 * process raises SIGBUS on access (so does an I/O error under a mapping of a
 * disk file). Code that reads a mapping does so inside a guard: a SIGBUS
 * whose address falls in the guarded range jumps back to the guard's
 * sigsetjmp, and the caller reports the source as changed. Any other SIGBUS
 * goes to the handler that was there before, or kills the process as it
 * would have without us.
 *
 * The handler is installed only while a guard user holds a reference
 * (tps_guard_hold / tps_guard_release), and the previous one is put back
 * when the last reference goes. */
#include "internal.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>

static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static int guard_refs;
static struct sigaction guard_old;
static _Thread_local tps_guard *guard_cur;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    tps_guard *g = guard_cur;
    const char *a = si ? (const char *)si->si_addr : NULL;
    if (g && si && si->si_code > 0 && a >= (const char *)g->lo && a < (const char *)g->hi) {
        guard_cur = NULL;
        siglongjmp(g->jb, 1);
    }
    /* Not ours: behave as if we had never been installed. */
    if ((guard_old.sa_flags & SA_SIGINFO) && guard_old.sa_sigaction) {
        guard_old.sa_sigaction(sig, si, uc);
        return;
    }
    if (guard_old.sa_handler == SIG_IGN && si && si->si_code <= 0) return; /* sent, and ignored */
    if (guard_old.sa_handler != SIG_DFL && guard_old.sa_handler != SIG_IGN) {
        guard_old.sa_handler(sig);
        return;
    }
    /* Default action: die of SIGBUS, as the faulting access would have. */
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
}

int tps_guard_hold(void)
{
    int ok = 1;
    pthread_mutex_lock(&guard_lock);
    if (guard_refs == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        ok = sigaction(SIGBUS, &sa, &guard_old) == 0;
    }
    if (ok) guard_refs++;
    pthread_mutex_unlock(&guard_lock);
    return ok;
}

void tps_guard_release(void)
{
    pthread_mutex_lock(&guard_lock);
    if (guard_refs > 0 && --guard_refs == 0) sigaction(SIGBUS, &guard_old, NULL);
    pthread_mutex_unlock(&guard_lock);
}

/* The handler runs on this thread: a signal fence orders the store with
 * the guarded reads around it. */
void tps_guard_enter(tps_guard *g)
{
    guard_cur = g;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

void tps_guard_leave(void)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    guard_cur = NULL;
}
