#include "run/run_state.h"

#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// The signal that asked the run to stop (SIGINT, SIGTERM, SIGHUP), or 0. A second one ends the
// process at once, unless it comes within STOP_REPEAT_NS of the first: one Ctrl-C can arrive
// twice (`timeout --foreground` passes the terminal's SIGINT on to a child that got it too).
volatile sig_atomic_t run_stop_signal;
static struct timespec stop_signal_time;
#define STOP_REPEAT_NS 250000000L

static void on_stop_signal(int sig) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  if (run_stop_signal) {
    long ns = (now.tv_sec - stop_signal_time.tv_sec) * 1000000000L +
              (now.tv_nsec - stop_signal_time.tv_nsec);
    if (ns >= STOP_REPEAT_NS) _exit(128 + sig);
    return;
  }
  stop_signal_time = now;
  run_stop_signal = sig;
}

// Whether SIGHUP was ignored when the process started (nohup), read before any shared library's
// constructor runs: the executable's preinit functions run first. With Open MPI 5 (Debian 13)
// libmpi loads UCX, whose libucs installs a SIGHUP handler of its own in its constructor, so by
// main() the ignored disposition nohup set is gone.
static int hup_ignored_at_start;
static void read_hup_at_start(void) {
  struct sigaction hup;
  hup_ignored_at_start = sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler == SIG_IGN;
}
__attribute__((used, section(".preinit_array"))) static void (*const read_hup_early)(void) =
    read_hup_at_start;

// A closed terminal or ssh session (SIGHUP) stops the run as SIGTERM does, unless the run was
// started to outlive it (nohup). (A closed pipe on
// stdout loses the progress lines, not the run: `tally train` ignores SIGPIPE from its start.)
void run_install_stop_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  // Under nohup SIGHUP is ignored on purpose: the run must outlive the terminal, and stays
  // ignored whatever a library installed since.
  if (hup_ignored_at_start) {
    signal(SIGHUP, SIG_IGN);
  } else {
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN)
      sigaction(SIGHUP, &sa, NULL);
  }
}

// Rank 0's view of the stop signal, shared with every replica so all stop after the same step.
// Its bytes fall outside the step's ledger record (counted after it, reset before the next).
int run_agreed_stop_signal(ReplicaState *r) {
  int sig = r->rank == 0 ? (int)run_stop_signal : 0;
  if (r->world > 1) comm_broadcast(r->comm, &sig, sizeof sig, 0);
  return sig;
}
