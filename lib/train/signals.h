// SIGTERM/SIGINT handling for the training loop: the handler only sets a flag; the loop checks
// it after each optimizer step (agreeing across ranks), saves a checkpoint and exits cleanly.
// A second signal while the save runs is left to the default action (the user insists).
#pragma once

namespace fsdp::train {

// Installs the handlers (idempotent).
void install_stop_handlers();
// True once SIGTERM or SIGINT arrived.
bool stop_requested();
// The signal number that requested the stop (0 when none).
int stop_signal();
// Clears the flag (tests).
void reset_stop_request();

}  // namespace fsdp::train
