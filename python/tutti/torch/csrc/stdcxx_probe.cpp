/* Linked alone into a shared object by python/tutti/torch/meson.build (never built into
 * the extension): which libstdc++ does this toolchain take, the shared one or the archive?
 * It uses the locale, as torch's error texts do. */
#include <locale>

const std::locale &tutti_stdcxx_probe()
{
    return std::locale::classic();
}
