/* guard.c - reading a mapped source safely.
 *
 * A page of a mapping that lies past the end of a file truncated by another
 * process raises SIGBUS on access (so does an I/O error under a mapping of a
 * disk file). Code that reads a mapping does so inside a guard: a SIGBUS
 * raised by an access in the guarded range jumps back to the guard's
 * sigsetjmp, and the caller reports the source as changed. Any other SIGBUS
 * is handled as the action that was there before would have handled it.
 *
 * The handler is installed only while a guard user holds a reference
 * (tps_guard_hold / tps_guard_release); the last release puts the previous
 * action back, unless someone replaced ours meanwhile. */
#include "internal.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>

static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static int guard_refs;
static struct sigaction guard_old; /* the action we replaced */
static _Thread_local tps_guard *guard_cur;

/* Faults of an access: a page past the end of the file, an I/O error, a
 * poisoned page being read. Not BUS_MCEERR_AO, which is a notice that can
 * arrive at any moment, nor a SIGBUS sent by kill (si_code <= 0). */
static int access_fault(const siginfo_t *si)
{
    if (!si) return 0;
    switch (si->si_code) {
    case BUS_ADRERR:
    case BUS_OBJERR:
#ifdef BUS_MCEERR_AR
    case BUS_MCEERR_AR:
#endif
        return 1;
    default: return 0;
    }
}

/* Installed with SA_NODEFER and an empty mask, so jumping out of it leaves
 * the thread's signal mask as it was: callers use sigsetjmp(jb, 0). */
static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    tps_guard *g = guard_cur;
    if (g && access_fault(si) && (const char *)si->si_addr >= (const char *)g->lo &&
        (const char *)si->si_addr < (const char *)g->hi) {
        guard_cur = NULL;
        siglongjmp(g->jb, 1);
    }
    /* Not ours: what the replaced action would have done. Its disposition
     * first: with SA_SIGINFO set, SIG_IGN and SIG_DFL still read as such
     * through sa_handler (the two share storage). */
    void (*h)(int) = guard_old.sa_handler;
    if (h == SIG_IGN && !access_fault(si)) return; /* a sent signal, ignored */
    if (h == SIG_IGN || h == SIG_DFL) {
        /* The default action (the kernel forces it on an ignored fault). */
        signal(SIGBUS, SIG_DFL);
        raise(SIGBUS);
        return;
    }
    sigset_t block, saved;
    block = guard_old.sa_mask;
    if (!(guard_old.sa_flags & SA_NODEFER)) sigaddset(&block, SIGBUS);
    sigprocmask(SIG_BLOCK, &block, &saved);
    int info = (guard_old.sa_flags & SA_SIGINFO) != 0;
    void (*ha)(int, siginfo_t *, void *) = guard_old.sa_sigaction;
    if (guard_old.sa_flags & SA_RESETHAND) {
        /* One-shot: later signals that are not ours get the default. */
        guard_old.sa_handler = SIG_DFL;
        guard_old.sa_flags &= ~SA_SIGINFO;
    }
    if (info)
        ha(sig, si, uc);
    else
        h(sig);
    sigprocmask(SIG_SETMASK, &saved, NULL);
}

int tps_guard_hold(void)
{
    int ok = 1;
    pthread_mutex_lock(&guard_lock);
    if (guard_refs == 0) {
        /* Read the old action before ours goes in: a signal arriving while
         * sigaction runs must find it. */
        ok = sigaction(SIGBUS, NULL, &guard_old) == 0;
        if (ok) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = on_sigbus;
            sa.sa_flags = SA_SIGINFO | SA_NODEFER | (guard_old.sa_flags & (SA_ONSTACK | SA_RESTART));
            sigemptyset(&sa.sa_mask);
            ok = sigaction(SIGBUS, &sa, NULL) == 0;
        }
    }
    if (ok) guard_refs++;
    pthread_mutex_unlock(&guard_lock);
    return ok;
}

void tps_guard_release(void)
{
    pthread_mutex_lock(&guard_lock);
    if (guard_refs > 0 && --guard_refs == 0) {
        struct sigaction now;
        /* Put the old action back only if ours is still the one installed. */
        if (sigaction(SIGBUS, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) &&
            now.sa_sigaction == on_sigbus)
            sigaction(SIGBUS, &guard_old, NULL);
    }
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
