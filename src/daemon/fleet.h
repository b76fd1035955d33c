// The daemon's side of a fleet (issue 15): the shared manifest store opened
// from the mount options, what `status` says of it and of the source's
// filesystem, and what a record that failed a chunk check leads to.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/manifest_store.h"
#include "mount_options.h"
#include "ckptfs/source_filesystem.h"
#include "ckptfs/status.h"
#include "ckptfs/view.h"

namespace ckptfs::daemon {

// Null without manifests=; fails (before mounting) on a missing directory or
// an unusable key file. Things worth a warning go to `warnings`.
Result<std::unique_ptr<ManifestStore>> OpenManifestStore(const MountOptions& o, std::vector<std::string>* warnings);

// Chooses the periodic rescan for the source's filesystem (kRemoteRescanS
// where inotify misses other clients' changes, unless rescan= was given) and
// says what it decided.
std::string AdaptRescanToFilesystem(const SourceFilesystem& fs, MountOptions& o);

// "source_filesystem" and "manifests" members of `status`.
void AddFleetStatus(nlohmann::json& status, const ManifestStore* store, const SourceFilesystem& fs,
                    const MountOptions& o);

// A chunk of `copy` did not match its chunk table: if the table came from a
// record, that record is never trusted again for this version of the file.
void DistrustRecordOf(ManifestStore* store, const std::string& real_source, const SourceCopy& copy);

}  // namespace ckptfs::daemon
