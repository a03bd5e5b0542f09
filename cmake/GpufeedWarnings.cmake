# Warnings as errors on our own targets only (never on third-party headers, which are SYSTEM).
function(gpufeed_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>)
endfunction()
