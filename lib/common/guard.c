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
 * action back, unless someone replaced ours meanwhile. An action installed
 * over ours that chains back to us ends in the default action rather than
 * a loop. */
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

static int one_shot_used; /* an SA_RESETHAND action has run once */
static _Thread_local int chaining; /* this thread is in the action we replaced */

/* The default action: death by SIGBUS (the kernel forces it on a fault that
 * is ignored). */
static void die_of_sigbus(void)
{
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
}

/* Installed with SA_NODEFER and an empty mask, so a nested fault reaches
 * it; callers still save the mask with sigsetjmp(jb, 1), since an action
 * installed over ours may call us with its own mask in force. */
static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    /* the innermost guard whose range holds the address (guards nest: a
     * write into a mapped output inside a read of a mapped source) */
    for (tps_guard *g = guard_cur; g && access_fault(si); g = g->prev)
        if ((const char *)si->si_addr >= (const char *)g->lo &&
            (const char *)si->si_addr < (const char *)g->hi) {
            guard_cur = g->prev;
            siglongjmp(g->jb, 1);
        }
    /* Not ours: what the replaced action would have done. One copy of it,
     * read once. Its disposition first: with SA_SIGINFO set, SIG_IGN and
     * SIG_DFL still read as such through sa_handler (they share storage). */
    struct sigaction old = guard_old;
    void (*h)(int) = old.sa_handler;
    if (chaining) {
        /* That action called us back (it chains to the one it replaced,
         * which was ours): a loop, which only the default ends. */
        die_of_sigbus();
        return;
    }
    if (h == SIG_IGN) {
        /* Sent, or a notice: ignored as before. A fault: the default. */
        if (!si || si->si_code <= 0
#ifdef BUS_MCEERR_AO
            || si->si_code == BUS_MCEERR_AO
#endif
        )
            return;
        die_of_sigbus();
        return;
    }
    /* A one-shot action runs once; the default after that. */
    int spent = (old.sa_flags & SA_RESETHAND) && __atomic_exchange_n(&one_shot_used, 1, __ATOMIC_SEQ_CST);
    if (h == SIG_DFL || spent) {
        die_of_sigbus();
        return;
    }
    sigset_t block, saved;
    block = old.sa_mask;
    if (!(old.sa_flags & SA_NODEFER)) sigaddset(&block, SIGBUS);
    sigprocmask(SIG_BLOCK, &block, &saved);
    chaining = 1;
    if (old.sa_flags & SA_SIGINFO)
        old.sa_sigaction(sig, si, uc);
    else
        h(sig);
    chaining = 0;
    sigprocmask(SIG_SETMASK, &saved, NULL);
}

int tps_guard_hold(void)
{
    int ok = 1;
    pthread_mutex_lock(&guard_lock);
    if (guard_refs == 0) {
        /* Read the old action before ours goes in: a signal arriving while
         * sigaction runs must find it. Ours still installed (someone put
         * it back after a release) is not an old action: keep the one we
         * replaced first. */
        struct sigaction cur;
        ok = sigaction(SIGBUS, NULL, &cur) == 0;
        if (ok && !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)) {
            guard_old = cur;
            one_shot_used = 0;
        }
        if (ok) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = on_sigbus;
            /* Restart what the old action restarted; an ignored signal
             * interrupted nothing, so restart then too. */
            sa.sa_flags = SA_SIGINFO | SA_NODEFER | (guard_old.sa_flags & (SA_ONSTACK | SA_RESTART));
            if (guard_old.sa_handler == SIG_IGN) sa.sa_flags |= SA_RESTART;
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
    chaining = 0; /* a chained action that jumped out of us is over */
    g->prev = guard_cur;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    guard_cur = g;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

void tps_guard_leave(void)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    guard_cur = guard_cur ? guard_cur->prev : NULL;
}
