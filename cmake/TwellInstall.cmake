# cmake --install: headers, the library, the twell tool, and twellConfig.cmake (twell::twell).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS twell EXPORT twellTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(_dir lib formats converters kernels)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/include/twell/config.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/twell)

install(EXPORT twellTargets NAMESPACE twell:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/twell)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/twellConfig.cmake.in
  ${PROJECT_BINARY_DIR}/twellConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/twell)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/twellConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/twellConfig.cmake ${PROJECT_BINARY_DIR}/twellConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/twell)
# `twell stats --png` looks for its plotting script here (share/twell) next to the installed tool.
if(TWELL_BUILD_TOOLS)
  install(PROGRAMS ${PROJECT_SOURCE_DIR}/bench/plot_stats.py DESTINATION ${CMAKE_INSTALL_DATADIR}/twell)
endif()
