// A stand-in for Apple's metal-cpp Foundation header, for testing the Metal host runtime
// (include/chroma/metal/host.h) on machines without Metal (tests/python/test_metal_host.py).
// Only what the runtime calls, with metal-cpp's signatures (checked against metal-cpp for
// macOS 14.2) and Cocoa's ownership rules: objects made by alloc/new/Create are the caller's to
// release; the others are autoreleased into the innermost AutoreleasePool. It counts objects
// alive and objects autoreleased with no pool in place (a leak under Cocoa), which the test
// reads through chroma_metal_fake_counts().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace NS {

using UInteger = std::uintptr_t;
using Integer = std::intptr_t;

enum StringEncoding : UInteger { UTF8StringEncoding = 4 };

class Object;

namespace fake {
struct Counts {
  long alive = 0;     // objects made and not yet freed
  long orphans = 0;   // objects autoreleased with no pool in place
  std::vector<std::vector<Object*>*> pools;
};
inline Counts& counts() {
  static Counts c;
  return c;
}
}  // namespace fake

class Object {
 public:
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  Object* retain() {
    ++refs_;
    return this;
  }
  void release() {
    if (--refs_ == 0) delete this;
  }
  Object* autorelease() {
    auto& c = fake::counts();
    if (c.pools.empty()) {
      ++c.orphans;
    } else {
      c.pools.back()->push_back(this);
    }
    return this;
  }

 protected:
  Object() { ++fake::counts().alive; }
  virtual ~Object() { --fake::counts().alive; }

 private:
  long refs_ = 1;
};

class String : public Object {
 public:
  static String* string(const char* s, StringEncoding) {
    auto* p = new String(s != nullptr ? s : "");
    p->autorelease();
    return p;
  }
  const char* utf8String() const { return s_.c_str(); }
  explicit String(std::string s) : s_(std::move(s)) {}  // owned by the fake's objects

 private:
  std::string s_;
};

class Error : public Object {
 public:
  explicit Error(std::string what) : what_(new String(std::move(what))) { autorelease(); }
  String* localizedDescription() const { return what_; }
  ~Error() override { what_->release(); }

 private:
  String* what_;
};

class AutoreleasePool : public Object {
 public:
  static AutoreleasePool* alloc() { return new AutoreleasePool; }
  AutoreleasePool* init() {
    fake::counts().pools.push_back(&objects_);
    return this;
  }
  ~AutoreleasePool() override {
    auto& c = fake::counts();
    if (!c.pools.empty() && c.pools.back() == &objects_) c.pools.pop_back();
    for (Object* o : objects_) o->release();
  }

 private:
  std::vector<Object*> objects_;
};

}  // namespace NS
