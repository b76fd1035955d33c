// What the mount options fill= and verify= choose for the FileServer,
// with the words the options spell them in (see option_words.h).
#pragma once

#include "ckptfs/option_words.h"

namespace ckptfs {

// When a file is copied into the host tier (mount option fill=).
enum class FillPolicy {
  kOpen,     // at its first open (in the background; that open takes the chunk path)
  kWait,     // at its first open, which waits for the copy and then passes through
  kPreload,  // only by ckptfsctl preload
  kOff,      // never: no host tier of whole files, every read takes the chunk path
};
// fill='s default, and a FileServer's: one default, the option's.
inline constexpr FillPolicy kDefaultFillPolicy = FillPolicy::kWait;
inline constexpr OptionWord<FillPolicy> kFillPolicyWords[] = {
    {FillPolicy::kOpen, "open"}, {FillPolicy::kWait, "wait"}, {FillPolicy::kPreload, "preload"}, {FillPolicy::kOff, "off"}};

// What every byte served is checked against (mount option verify=).
enum class Verify {
  kXxh3,    // each chunk's XXH3-128 from the index: catches corruption, not forgery
  kSha256,  // and the file's SHA-256: each chunk against the file's SHA-256
            // chain (ChunkChain), or where none is known yet a whole copy
            // before it is sealed, and on the chunk path a chain proven by
            // a pass over the whole file first (ProvenChunkTables)
  kAuto,    // kSha256 for bytes read from a copy that someone other than root
            // and the mount's owner could have written (SourceCopy::trusted),
            // kXxh3 for the others: a user who could craft chunks that pass
            // XXH3-128 cannot serve them under a digest, and trusted trees pay
            // nothing more
};
inline constexpr OptionWord<Verify> kVerifyWords[] = {
    {Verify::kXxh3, "xxh3"}, {Verify::kSha256, "sha256"}, {Verify::kAuto, "auto"}};

}  // namespace ckptfs
