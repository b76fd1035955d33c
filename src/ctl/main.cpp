// ckptfsctl: the admin's tool for ckptfs. Argument parsing only; each command
// lives in its own file.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "ckptfs/build_info.h"
#include "ckptfs/catalog.h"
#include "ckptfs/control_protocol.h"
#include "ctl.h"

using namespace ckptfs::ctl;
using ckptfs::Printable;
namespace protocol = ckptfs::protocol;

namespace {

// A subcommand and what runs it once parsing chose it. Each command's
// arguments live in the closure.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

// The PATH every command that talks to a mount takes.
void AddMountPath(CLI::App* cmd, std::string& path) {
  cmd->add_option("PATH", path, "A ckptfs mount point or any path inside one")->required();
}

// digest, verify, resolve: work on a source tree, no mount needed.
void AddTreeCommands(CLI::App& app, const GlobalOptions& g, std::vector<Command>& out) {
  auto digest = std::make_shared<DigestArgs>();
  auto* cmd_digest = app.add_subcommand(
      "digest", "Print 'sha256-<hex>  PATH' for every checkpoint found under each DIR (hashes are cached in the index)");
  cmd_digest->add_option("DIR", digest->dirs, "Source trees or checkpoint directories")->required();
  auto* manifest_flag = cmd_digest->add_flag(
      "--manifest", digest->manifest,
      "Print the canonical manifest lines instead ('<sha256>  <path>'); for several checkpoints a\n"
      "'# NAME  PATH' line heads each block");
  cmd_digest->add_flag("--json", digest->json, "Print JSON: path, name, digest, size, files with size and sha256")
      ->excludes(manifest_flag);
  cmd_digest->add_flag("--no-nested", digest->no_nested,
                       "Only the checkpoint that each DIR is itself, not those nested below it, so that\n"
                       "'digest --manifest --no-nested CHECKPOINT | sha256sum' is its digest");
  cmd_digest->add_flag("-v,--verbose", digest->verbose,
                       "Report on stderr how many files were hashed or taken from the index");
  cmd_digest->add_flag("--stamped", digest->stamped,
                       "Arguments are *.safetensors files: print (JSON) the header each would be served with under\n"
                       "the mount option stamp_headers: __metadata__ gains ckptfs.checkpoint (the digest of the\n"
                       "file's directory) and ckptfs.sha256")
      ->excludes(manifest_flag);
  out.push_back({cmd_digest, [&g, digest] { return digest->stamped ? RunDigestStamped(g, *digest) : RunDigest(g, *digest); }});

  auto verify = std::make_shared<VerifyArgs>();
  auto* cmd_verify = app.add_subcommand(
      "verify", "Re-read every file under each DIR, ignoring the index, and report files whose content no longer\n"
                "matches the index (MISMATCH: changed with its stamp intact; CHANGED: modified since indexed;\n"
                "NOT-INDEXED: never digested; INDEX-ERROR: the index could not be read)");
  cmd_verify->add_option("DIR", verify->dirs, "Source trees or checkpoint directories")->required();
  cmd_verify->add_flag("--json", verify->json, "Print JSON");
  out.push_back({cmd_verify, [&g, verify] { return RunVerify(g, *verify); }});

  auto resolve_path = std::make_shared<std::string>();
  auto* cmd_resolve = app.add_subcommand(
      "resolve", "Print the digest path of a checkpoint (give engines this path: it changes with every byte)");
  cmd_resolve->add_option("PATH", *resolve_path,
                          "A by-name link, the by-name directory of a checkpoint that holds nested ones, or any\n"
                          "path inside a digest directory")
      ->required();
  out.push_back({cmd_resolve, [resolve_path] { return RunResolve(*resolve_path); }});
}

// status, ls, rescan, restart: queries and changes of a mount.
void AddMountCommands(CLI::App& app, std::vector<Command>& out) {
  auto add = [&](std::string_view name, const std::string& help, auto run) {
    auto args = std::make_shared<MountArgs>();
    auto* cmd = app.add_subcommand(std::string(name), help);
    AddMountPath(cmd, args->path);
    cmd->add_flag("--json", args->json, "Print JSON");
    out.push_back({cmd, [args, run] { return run(*args); }});
  };
  add(protocol::kStatus,
      "Show a mount's checkpoints being indexed, pending or invalid (with the reason), its state directory\n"
      "and options",
      RunStatus);
  add(protocol::kLs,
      "List a mount's digest directories: digest, files, size, indexed at, by-name paths; given a path\n"
      "inside the mount, only the checkpoints at or below it",
      RunLs);
  add(protocol::kRescan, "Ask a mount to rescan its source now (root or the mount's owner)", RunRescan);

  auto restart = std::make_shared<RestartArgs>();
  auto* cmd_restart = app.add_subcommand(
      std::string(protocol::kRestart),
      "Hand a mount to a new daemon without unmounting it (root or the mount's owner; needs\n"
      "supervise=on): the supervisor starts the new binary, it takes the FUSE connection over, the old\n"
      "daemon finishes the requests in hand and exits. Waits until the new daemon serves");
  AddMountPath(cmd_restart, restart->path);
  cmd_restart->add_option("--binary", restart->binary,
                          "The ckptfs to run (an absolute path; default: the one installed where the running\n"
                          "one was started from, e.g. after a package upgrade)");
  cmd_restart->add_flag("--json", restart->json, "Print JSON");
  out.push_back({cmd_restart, [restart] { return RunRestart(*restart); }});
}

// preload, unpin, evict, stats: a mount's cache.
void AddCacheCommands(CLI::App& app, std::vector<Command>& out) {
  auto add = [&](std::string_view name, const std::string& help, const std::string& path_help) {
    auto args = std::make_shared<CacheArgs>();
    args->command = std::string(name);
    auto* cmd = app.add_subcommand(std::string(name), help);
    cmd->add_option("PATH", args->path, path_help)->required();
    out.push_back({cmd, [args] { return RunCacheCommand(*args); }});
    return std::make_pair(cmd, args);
  };
  auto [cmd_preload, preload] = add(
      protocol::kPreload,
      "Copy every file of PATH into the host tier, verified, with a progress bar, so that opens pass\n"
      "through to the kernel (root or the mount's owner). PATH: a digest directory, a by-name link, the\n"
      "by-name directory of a checkpoint or a file under a mount",
      "What to preload");
  // Hidden: the host tier is the only one; RunCacheCommand refuses --tier
  // gpu, of the removed GPU chunk tier, with why and what to use instead.
  cmd_preload->add_option("--tier", preload->tier)->group("");
  cmd_preload->add_flag("--pin", preload->pin, "Keep them, locked in memory: eviction never touches them until unpin");
  add(protocol::kUnpin, "Let the cache evict PATH's files and chunks again", "Like preload's PATH");
  add(protocol::kEvict, "Drop PATH's files and chunks from every tier now, pinned or not", "Like preload's PATH");

  auto stats = std::make_shared<StatsArgs>();
  auto* cmd_stats = app.add_subcommand(
      std::string(protocol::kStats),
      "Cache numbers of a mount: passthrough mode, opens by how they were served; per tier bytes used\n"
      "and capacity, hits, misses, fills, evictions; fill rate, bytes held by readers; verification\n"
      "failures, read-ahead and preload fills; per checkpoint (with its by-name paths) bytes resident and\n"
      "pinned; given a path inside the mount, only the checkpoints at or below it. The counters of the whole "
      "node are shown to root and the mount's owner only; other users get their checkpoints' rows");
  AddMountPath(cmd_stats, stats->path);
  auto* stats_json = cmd_stats->add_flag("--json", stats->json, "Print JSON");
  cmd_stats->add_flag("--prometheus", stats->prometheus,
                      "Print the Prometheus text format (for node_exporter's textfile collector)")
      ->excludes(stats_json);
  out.push_back({cmd_stats, [stats] { return RunStats(*stats); }});
}

// keygen, publish: the shared manifest store.
void AddFleetCommands(CLI::App& app, const GlobalOptions& g, std::vector<Command>& out) {
  auto keygen = std::make_shared<KeygenArgs>();
  auto* cmd_keygen = app.add_subcommand(
      "keygen", "Make an Ed25519 key pair for signing manifest records: KEY (private, mode 0600) and KEY.pub\n"
                "(public; concatenate the .pub files of every signer into the file given as manifest_keys=)");
  cmd_keygen->add_option("KEY", keygen->key_path, "Where to write the private key")->required();
  cmd_keygen->add_flag("--force", keygen->force, "Replace KEY and KEY.pub if they exist");
  out.push_back({cmd_keygen, [keygen] { return RunKeygen(*keygen); }});

  auto publish = std::make_shared<PublishArgs>();
  auto* cmd_publish = app.add_subcommand(
      "publish", "Index SRC once and publish a signed record of every file (path, size, mtime, SHA-256, chunk\n"
                 "table) into a manifest store, so that mounts with manifests=DIR and a keyring holding the key's\n"
                 "public half hash nothing; files that already have a trusted record are not read");
  cmd_publish->add_option("SRC", publish->source, "The source tree, as the daemons mount it")->required();
  cmd_publish->add_option("--manifests", publish->manifests, "The manifest store, an existing directory (required)")
      ->required()
      ->option_text("DIR");
  cmd_publish->add_option("--sign", publish->sign, "Private key (from keygen) that signs the records (required)")
      ->required()
      ->option_text("KEY");
  cmd_publish->add_option("--keys", publish->keys,
                          "Public keys whose records are reused instead of re-hashing (the signing key's own\n"
                          "always are)")
      ->option_text("FILE");
  cmd_publish->add_flag("--json", publish->json, "Print JSON: checkpoints, files hashed, records written");
  out.push_back({cmd_publish, [&g, publish] { return RunPublish(g, *publish); }});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ckptfsctl - inspect and digest model checkpoints for ckptfs.\n"
      "A checkpoint is a directory that directly holds a weight file (*.safetensors, *.bin, *.pt,\n"
      "*.pth, *.ckpt, *.gguf); its name is sha256-<hex>, the SHA-256 of its canonical manifest.",
      "ckptfsctl"};
  app.footer(
      "Exit status: 0 success; 1 some checkpoint or file failed (the rest were reported);\n"
      "2 usage error; 3 nothing could be done (bad source, no checkpoints, unusable index).\n"
      "Index: STATE/index.db, where STATE is --state, else /var/lib/ckptfs for root,\n"
      "else $XDG_STATE_HOME/ckptfs (~/.local/state/ckptfs).");
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the command
  app.set_version_flag("--version", ckptfs::BuildDescription());

  GlobalOptions g;
  app.add_option("--state", g.state_dir, "Directory that holds the index (index.db)")->option_text("DIR");
  app.add_option("--threads", g.threads, "Hashing threads (default: one per CPU)")
      ->check(CLI::Range(1u, 1024u))
      ->option_text("N");
  app.add_option("--symlinks", g.symlinks,
                 "contained: follow links only when they resolve inside the tree (default);\n"
                 "follow: follow every link (trusted trees)")
      ->check(CLI::IsMember({"contained", "follow"}))
      ->option_text("POLICY");
  app.add_flag("-q,--quiet", g.quiet, "No progress bar");

  std::vector<Command> commands;
  AddTreeCommands(app, g, commands);
  AddMountCommands(app, commands);
  AddCacheCommands(app, commands);
  AddFleetCommands(app, g, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  for (const auto& c : commands) {
    if (!*c.app) continue;
    // A reply whose members have the wrong types (a broken or fake server)
    // is reported, not an abort.
    try {
      return c.run();
    } catch (const nlohmann::json::exception& e) {
      PrintError(std::string("malformed reply from the daemon: ") + Printable(e.what()));
      return kExitFatal;
    }
  }
  return kExitUsage;
}
