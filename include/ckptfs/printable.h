// Text for a person to read, with every control character escaped: what
// ckptfsctl prints of what a control socket sent, so that no server (a fake
// one, or a real one echoing a hostile SRC writer's file name) can make the
// terminal run escape sequences (issue 21 item 15); and every line of the
// daemon's log, which names paths a SRC writer chose (a newline in one
// would forge a log line).
#pragma once

#include <string>
#include <string_view>

namespace ckptfs {

// `text` with control characters (C0, DEL, C1 in UTF-8 or as single bytes)
// and the backslash written as \xNN (a name's own "\x0a" then reads
// "\x5cx0a", never as an escaped newline); other bytes, UTF-8 or not, as
// they are.
std::string Printable(std::string_view text);

}  // namespace ckptfs
