#pragma once
// Declaration-only stand-in (see ../../README.md): held through smart pointers only.
namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
