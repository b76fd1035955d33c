# What the Debian package (packaging/debian, built by dpkg-buildpackage:
# scripts/build-deb.sh) takes from the CMake install besides the programs and
# units: the man pages and the copyright file. Included from the top-level
# CMakeLists.txt.

set(_pkg ${CMAKE_CURRENT_LIST_DIR})
set(_pkg_out ${CMAKE_BINARY_DIR}/packaging)
file(MAKE_DIRECTORY ${_pkg_out})

# The maintainer, in the control file and in packaging/debian/changelog (keep
# the two the same). example.org is a placeholder: whoever publishes the
# package puts a working address in both.
set(CKPTFS_DEB_MAINTAINER "ckptfs developers <ckptfs@example.org>")

# The Debian revision comes from packaging/debian/changelog, whose latest
# entry must be for this version, so a new version cannot ship without one.
file(STRINGS ${_pkg}/changelog _changelog_top LIMIT_COUNT 1)
if(NOT _changelog_top MATCHES "^ckptfs \\(([^()-]+)-([^()-]+)\\) ")
  message(FATAL_ERROR "${_pkg}/changelog: the first line must read "
    "'ckptfs (VERSION-REVISION) DISTRIBUTION; urgency=...', not '${_changelog_top}'")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "${_pkg}/changelog: the latest entry is for ${CMAKE_MATCH_1}, but project() "
    "says ${PROJECT_VERSION}; add an entry for ${PROJECT_VERSION}-1")
endif()

# The man pages, plain: dh_compress compresses them (gzip -9n) in the
# package. ckptfs(8) documents the mount helper too (MOUNT HELPER); a link
# serves `man mount.ckptfs` (Debian policy prefers a link to a .so request).
install(FILES ${PROJECT_SOURCE_DIR}/packaging/man/ckptfs.8 ${PROJECT_SOURCE_DIR}/packaging/man/ckptfsctl.8
        DESTINATION share/man/man8)
install(CODE "file(CREATE_LINK ckptfs.8 \$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/share/man/man8/mount.ckptfs.8 SYMBOLIC)")

# The copyright file, in the machine-readable (DEP-5) format. Besides our own
# (Expat, LICENSE) it names what is compiled into the binaries: the
# header-only nlohmann-json and CLI11 and, when the GPU code is built, the
# static CUDA runtime, whose license is the CUDA Toolkit EULA, copied from
# the toolkit the binaries were linked against.
set(CKPTFS_COPYRIGHT_CUDA_COMMENT "")
set(CKPTFS_COPYRIGHT_CUDA_HOLDER "")
set(CKPTFS_COPYRIGHT_CUDA_LICENSE "")
set(CKPTFS_COPYRIGHT_CUDA_PARAGRAPH "")
if(CKPTFS_HAVE_CUDA)
  set(CKPTFS_CUDA_LICENSE_FILE "" CACHE FILEPATH
      "The CUDA Toolkit EULA to copy into the package's copyright file (empty: look in the toolkit)")
  set(_cuda_license "")
  get_filename_component(_cuda_root ${CUDAToolkit_BIN_DIR} DIRECTORY)
  if(CKPTFS_CUDA_LICENSE_FILE)
    if(NOT EXISTS "${CKPTFS_CUDA_LICENSE_FILE}")
      message(FATAL_ERROR "CKPTFS_CUDA_LICENSE_FILE=${CKPTFS_CUDA_LICENSE_FILE}: no such file")
    endif()
    set(_cuda_license ${CKPTFS_CUDA_LICENSE_FILE})
  else()
    # Where toolkits keep the EULA: EULA.txt at the root of NVIDIA's
    # installers, License.txt in the runtime's dist-info of the pip-packaged
    # toolkit, the copyright file of Debian's non-free packaging.
    file(GLOB _cuda_license_candidates
      ${_cuda_root}/EULA.txt
      ${CUDAToolkit_LIBRARY_ROOT}/EULA.txt
      ${_cuda_root}/dist-info/nvidia_cuda_runtime-*.dist-info/licenses/License.txt
      /usr/share/doc/nvidia-cuda-toolkit/copyright)
    if(_cuda_license_candidates)
      list(GET _cuda_license_candidates 0 _cuda_license)
    endif()
  endif()
  set(CKPTFS_COPYRIGHT_CUDA_COMMENT ", and, linked
 statically, the NVIDIA CUDA runtime (libcudart_static.a of CUDA Toolkit
 ${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}), which its EULA lists as redistributable (Attachment A)")
  set(CKPTFS_COPYRIGHT_CUDA_HOLDER "\n NVIDIA Corporation")
  set(CKPTFS_COPYRIGHT_CUDA_LICENSE " and NVIDIA-CUDA-Toolkit-EULA")
  if(_cuda_license)
    # DEP-5 license text: every line indented by one space, an empty line
    # written as " .".
    execute_process(
      COMMAND sed -e "s/[[:space:]]*$//" -e "s/^$/./" -e "s/^/ /" "${_cuda_license}"
      OUTPUT_VARIABLE _cuda_license_text
      OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _sed_rc)
    if(NOT _sed_rc EQUAL 0 OR _cuda_license_text STREQUAL "")
      message(FATAL_ERROR "cannot read the CUDA Toolkit EULA from ${_cuda_license}")
    endif()
    message(STATUS "ckptfs: package copyright file carries the CUDA EULA from ${_cuda_license}")
  else()
    message(WARNING "ckptfs: no CUDA Toolkit EULA found under ${_cuda_root} (looked for EULA.txt and "
      "dist-info/nvidia_cuda_runtime-*/licenses/License.txt); the package's copyright file will only "
      "point to it. Set -DCKPTFS_CUDA_LICENSE_FILE=PATH to include its text.")
    set(_cuda_license_text " The CUDA Toolkit End User License Agreement; this build found no copy of
 its text in the toolkit. NVIDIA publishes it at
 https://docs.nvidia.com/cuda/eula/index.html")
  endif()
  set(CKPTFS_COPYRIGHT_CUDA_PARAGRAPH "\n\nLicense: NVIDIA-CUDA-Toolkit-EULA\n${_cuda_license_text}")
endif()
# dh_installdocs installs no copyright file of its own (there is no
# debian/copyright): this one, which knows what the build linked in, is it.
configure_file(${_pkg}/copyright.in ${_pkg_out}/copyright @ONLY)
install(FILES ${_pkg_out}/copyright DESTINATION share/doc/ckptfs)
