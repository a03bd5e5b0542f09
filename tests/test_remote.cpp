// Remote data's local parts: URLs (recognised, refused, redacted), the S3 configuration found as
// boto3 finds it, s3:// -> HTTP URLs, the shard index format (round trip, refusals; `gpufeed
// pack`'s indexes against the tar headers: test_pack.cpp). The network side (servers, faults,
// secrets) is python/tests/test_remote.py's.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/datasets/remote.h"
#include "gpufeed/datasets/shards.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace gpufeed::loader;
using namespace gpufeed::datasets;

namespace {

// Sets (or unsets, for nullptr) environment variables for one scope.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) {
        ::setenv(name, value, 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  ~Env() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Every AWS variable s3_config reads, unset, and HOME pointed at `home`.
class NoAws : public Env {
 public:
  explicit NoAws(const char* home)
      : Env({{"AWS_ACCESS_KEY_ID", nullptr}, {"AWS_SECRET_ACCESS_KEY", nullptr}, {"AWS_SESSION_TOKEN", nullptr},
             {"AWS_PROFILE", nullptr}, {"AWS_REGION", nullptr}, {"AWS_DEFAULT_REGION", nullptr},
             {"AWS_ENDPOINT_URL", nullptr}, {"AWS_ENDPOINT_URL_S3", nullptr}, {"AWS_CONFIG_FILE", nullptr},
             {"AWS_SHARED_CREDENTIALS_FILE", nullptr}, {"AWS_DEFAULT_PROFILE", nullptr}, {"AWS_CA_BUNDLE", nullptr},
             {"HOME", home}}) {}
};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

}  // namespace

TEST(RemoteUrl, RecognisesUrlsAndRefusesOtherSchemes) {
  EXPECT_TRUE(is_url("s3://bucket/key.tar"));
  EXPECT_TRUE(is_url("https://host/x.tar"));
  EXPECT_TRUE(is_url("ftp://host/x.tar"));
  EXPECT_FALSE(is_url("/data/train-{000..001}.tar"));
  EXPECT_FALSE(is_url("data:with/colon"));
  EXPECT_FALSE(is_url("://nothing"));
  EXPECT_NO_THROW(check_url("http://h/a.tar"));
  EXPECT_NO_THROW(check_url("s3://b/a.tar"));
  for (const char* bad : {"ftp://h/a.tar", "file:///tmp/a.tar", "gs://b/a.tar"}) {
    try {
      check_url(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("http, https and s3 are accepted"), std::string::npos) << e.what();
    }
  }
  // What open_dataset refuses, before any listing.
  EXPECT_THROW(open_dataset("ftp://127.0.0.1/train-000000.tar"), std::invalid_argument);
}

TEST(RemoteUrl, RedactsQueriesAndUserInfo) {
  EXPECT_EQ(redact_url("https://h/a.tar?X-Amz-Signature=abc&X-Amz-Credential=AKIA"), "https://h/a.tar?<redacted>");
  EXPECT_EQ(redact_url("https://user:pass@h:8080/a.tar"), "https://<redacted>@h:8080/a.tar");
  EXPECT_EQ(redact_url("http://h/a@b.tar"), "http://h/a@b.tar");  // an '@' in the path is no user info
  EXPECT_EQ(redact_url("s3://bucket/key.tar"), "s3://bucket/key.tar");
  EXPECT_EQ(redact_url("s3://bucket/odd?key#1.tar"), "s3://bucket/odd?key#1.tar");  // no query: part of the key
  EXPECT_EQ(redact_url("http://h/a.tar#frag"), "http://h/a.tar");
}

TEST(RemoteUrl, ListsUrlsFromPatternsAndListFiles) {
  EXPECT_EQ(remote_shard_urls("s3://b/p/train-{0..2}.tar"),
            (std::vector<std::string>{"s3://b/p/train-0.tar", "s3://b/p/train-1.tar", "s3://b/p/train-2.tar"}));
  gpufeed::test::TempDir tmp("remote_list");
  write(tmp.path / "urls.txt", "# shards\n\nhttp://h/a.tar\r\n  https://h/b.tar  \n");
  EXPECT_EQ(remote_shard_urls((tmp.path / "urls.txt").string()),
            (std::vector<std::string>{"http://h/a.tar", "https://h/b.tar"}));
  write(tmp.path / "mixed.txt", "http://h/a.tar\nlocal.tar\n");
  EXPECT_THROW(remote_shard_urls((tmp.path / "mixed.txt").string()), std::invalid_argument);
  write(tmp.path / "ftp.txt", "ftp://h/a.tar\n");
  EXPECT_THROW(remote_shard_urls((tmp.path / "ftp.txt").string()), std::invalid_argument);
  write(tmp.path / "local.txt", "a.tar\n");
  EXPECT_TRUE(remote_shard_urls((tmp.path / "local.txt").string()).empty());
  EXPECT_TRUE(remote_shard_urls((tmp.path / "nothing").string()).empty());
}

TEST(S3Config, EnvironmentFirstThenTheProfilesFiles) {
  gpufeed::test::TempDir home("remote_home");
  write(home.path / ".aws" / "credentials",
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = secretdefault\n"
        "[work]\naws_access_key_id=AKIDWORK\naws_secret_access_key=secretwork\naws_session_token=tokenwork\n");
  write(home.path / ".aws" / "config",
        "[default]\nregion = eu-west-1\n[profile work]\nregion = ap-south-1\nendpoint_url = http://127.0.0.1:9000/\n"
        "s3 =\n  addressing_style = path\n");
  NoAws clean(home.path.c_str());
  S3Config c = s3_config("");
  EXPECT_EQ(c.access_key, "AKIDDEFAULT");
  EXPECT_EQ(c.secret_key, "secretdefault");
  EXPECT_EQ(c.session_token, "");
  EXPECT_EQ(c.region, "eu-west-1");
  EXPECT_EQ(c.endpoint_url, "");
  {
    Env profile({{"AWS_PROFILE", "work"}});
    c = s3_config("");
    EXPECT_EQ(c.access_key, "AKIDWORK");
    EXPECT_EQ(c.session_token, "tokenwork");
    EXPECT_EQ(c.region, "ap-south-1");
    EXPECT_EQ(c.endpoint_url, "http://127.0.0.1:9000");  // trailing '/' dropped
    EXPECT_EQ(s3_config("http://other:1").endpoint_url, "http://other:1");  // the option wins
  }
  {
    Env env({{"AWS_ACCESS_KEY_ID", "AKIDENV"}, {"AWS_SECRET_ACCESS_KEY", "secretenv"}, {"AWS_SESSION_TOKEN", "tok"},
             {"AWS_REGION", "us-west-2"}, {"AWS_ENDPOINT_URL", "http://generic:1"},
             {"AWS_ENDPOINT_URL_S3", "http://s3only:2"}});
    c = s3_config("");
    EXPECT_EQ(c.access_key, "AKIDENV");
    EXPECT_EQ(c.secret_key, "secretenv");
    EXPECT_EQ(c.session_token, "tok");
    EXPECT_EQ(c.region, "us-west-2");
    EXPECT_EQ(c.endpoint_url, "http://s3only:2");
  }
  {
    Env files({{"AWS_SHARED_CREDENTIALS_FILE", (home.path / "none").c_str()},
               {"AWS_CONFIG_FILE", (home.path / "none").c_str()}});
    c = s3_config("");
    EXPECT_EQ(c.access_key, "");  // unsigned requests
    EXPECT_EQ(c.region, "us-east-1");
  }
  EXPECT_THROW(s3_config("ftp://host"), std::invalid_argument);
  EXPECT_THROW(s3_config("not a url"), std::invalid_argument);
}

// botocore's order (its 'profile' setting: AWS_DEFAULT_PROFILE, then AWS_PROFILE); the Python
// test checks it against boto3 itself.
TEST(S3Config, AwsDefaultProfileBeforeAwsProfileAsBotocore) {
  gpufeed::test::TempDir home("remote_default_profile");
  write(home.path / ".aws" / "credentials",
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s0\n"
        "[one]\naws_access_key_id = AKIDONE\naws_secret_access_key = s1\n"
        "[two]\naws_access_key_id = AKIDTWO\naws_secret_access_key = s2\n");
  write(home.path / ".aws" / "config", "[profile one]\nregion = eu-north-1\n[profile two]\nregion = sa-east-1\n");
  NoAws clean(home.path.c_str());
  {
    Env e({{"AWS_DEFAULT_PROFILE", "one"}});
    const S3Config c = s3_config("");
    EXPECT_EQ(c.access_key, "AKIDONE");
    EXPECT_EQ(c.region, "eu-north-1");
  }
  {
    Env e({{"AWS_DEFAULT_PROFILE", "one"}, {"AWS_PROFILE", "two"}});
    const S3Config c = s3_config("");
    EXPECT_EQ(c.access_key, "AKIDONE");
    EXPECT_EQ(c.region, "eu-north-1");
  }
  {
    Env e({{"AWS_PROFILE", "two"}});
    EXPECT_EQ(s3_config("").access_key, "AKIDTWO");
  }
}

TEST(S3Config, CredentialProcessAndCaBundleOfTheProfile) {
  gpufeed::test::TempDir home("remote_credential_process");
  // The helper sits in a folder whose name has a space: the command line is split as a shell
  // splits it, quotes included.
  const fs::path helper = home.path / "a dir" / "helper.sh";
  write(helper,
        "#!/bin/sh\n"
        "printf '{\"Version\": 1, \"AccessKeyId\": \"AKIDPROC%s\", \"SecretAccessKey\": \"se\\\\/cret\",\\n'"
        " \"$1\"\n"
        "printf ' \"SessionToken\": \"tok\\\\u00e9\", \"Expiration\": \"2031-02-03T04:05:06Z\"}'\n");
  fs::permissions(helper, fs::perms::owner_all);
  write(home.path / ".aws" / "config",
        "[profile proc]\nregion = eu-west-3\nca_bundle = /etc/proc-ca.pem\ncredential_process = \"" +
            helper.string() + "\" 'arg one'\n"
            "[profile keys]\naws_access_key_id = AKIDKEYS\naws_secret_access_key = sk\n"
            "credential_process = /bin/false\n");
  write(home.path / ".aws" / "credentials", "[keys]\naws_access_key_id = AKIDCREDFILE\naws_secret_access_key = cf\n");
  NoAws clean(home.path.c_str());
  {
    Env e({{"AWS_PROFILE", "proc"}});
    S3Config c = s3_config("");
    EXPECT_EQ(c.access_key, "AKIDPROCarg one");
    EXPECT_EQ(c.secret_key, "se/cret");
    EXPECT_EQ(c.session_token, "tok\xc3\xa9");
    EXPECT_EQ(c.region, "eu-west-3");
    EXPECT_EQ(c.ca_bundle, "/etc/proc-ca.pem");
    ASSERT_TRUE(c.expiration.has_value());
    EXPECT_EQ(std::chrono::system_clock::to_time_t(*c.expiration), 1927857906);  // 2031-02-03T04:05:06Z
    Env ca({{"AWS_CA_BUNDLE", "/etc/env-ca.pem"}});
    EXPECT_EQ(s3_config("").ca_bundle, "/etc/env-ca.pem");
  }
  {
    // The shared credentials file comes before the process (which would fail), as in botocore.
    Env e({{"AWS_PROFILE", "keys"}});
    const S3Config c = s3_config("");
    EXPECT_EQ(c.access_key, "AKIDCREDFILE");
    EXPECT_FALSE(c.expiration.has_value());
    EXPECT_EQ(c.ca_bundle, "");
  }
}

TEST(S3Config, AFailingCredentialProcessNamesTheProfileAndWhy) {
  gpufeed::test::TempDir home("remote_process_fails");
  const fs::path fails = home.path / "fails.sh";
  write(fails, "#!/bin/sh\necho 'token expired: run aws sso login' >&2\necho 'second line' >&2\nexit 3\n");
  const fs::path prints = home.path / "prints.sh";
  write(prints, "#!/bin/sh\necho '{\"Version\": 2, \"AccessKeyId\": \"AKIDSECRET\", \"SecretAccessKey\": \"x\"}'\n");
  for (const fs::path& p : {fails, prints}) fs::permissions(p, fs::perms::owner_all);
  write(home.path / ".aws" / "config",
        "[profile fails]\ncredential_process = " + fails.string() + " --secret-arg\n"
        "[profile prints]\ncredential_process = " + prints.string() + "\n"
        "[profile slow]\ncredential_process = sleep 30\n"
        "[profile missing]\ncredential_process = /nonexistent/helper\n"
        "[profile unterminated]\ncredential_process = helper 'arg\n");
  NoAws clean(home.path.c_str());
  const auto error = [](const char* profile, double timeout_s = 60) {
    Env e({{"AWS_PROFILE", profile}});
    try {
      s3_config("", timeout_s);
    } catch (const RemoteError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error("fails"), "the credential_process of AWS profile 'fails' (" + fails.string() +
                                ") failed: exit status 3: token expired: run aws sso login");
  const std::string version = error("prints");
  EXPECT_EQ(version, "the credential_process of AWS profile 'prints' (" + prints.string() +
                         ") printed Version 2; version 1 is supported");
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(error("slow", 0.5), "the credential_process of AWS profile 'slow' (sleep) timed out after 0.5 s (killed)");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));  // not the 30 s it sleeps
  EXPECT_EQ(error("missing"),
            "the credential_process of AWS profile 'missing' (/nonexistent/helper) cannot be run: No such file or directory");
  EXPECT_EQ(error("unterminated"),
            "the credential_process of AWS profile 'unterminated' cannot be split into words: an unterminated ' quote");
}

TEST(S3Config, SaysWhereItLookedWhenNoCredentialsAreFound) {
  gpufeed::test::TempDir home("remote_no_credentials");
  write(home.path / ".aws" / "config", "[profile other]\nregion = eu-west-1\n");
  NoAws clean(home.path.c_str());
  Env e({{"AWS_DEFAULT_PROFILE", "ml"}});
  const S3Config c = s3_config("");
  EXPECT_EQ(c.access_key, "");  // unsigned requests: public buckets stay readable
  EXPECT_EQ(c.searched, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (unset); profile 'ml' (AWS_DEFAULT_PROFILE); "
                        "the shared credentials file " + (home.path / ".aws" / "credentials").string() +
                        " (not there); the profile's credential_process (none); the config file " +
                        (home.path / ".aws" / "config").string() + " (no such profile)");
}

TEST(S3Config, PathStyleOnAnEndpointVirtualHostedOnAws) {
  S3Config c;
  c.endpoint_url = "http://127.0.0.1:9000";
  EXPECT_EQ(s3_http_url("s3://bucket/a dir/train-000001.tar", c), "http://127.0.0.1:9000/bucket/a%20dir/train-000001.tar");
  c.endpoint_url.clear();
  c.region = "eu-central-1";
  EXPECT_EQ(s3_http_url("s3://bucket/k+1.tar", c), "https://bucket.s3.eu-central-1.amazonaws.com/k%2B1.tar");
  EXPECT_THROW(s3_http_url("s3://bucket", c), std::invalid_argument);
  EXPECT_THROW(s3_http_url("s3:///key", c), std::invalid_argument);
  EXPECT_THROW(s3_http_url("s3://bucket/", c), std::invalid_argument);
}

TEST(ShardIndexFormat, RoundTripsAndRefusesWhatItCannotUse) {
  const std::string sha(64, 'a');
  ShardIndex index{.shard_size = 10240, .sha256 = sha, .etag = "\"abc-1\"",
                   .samples = {{.member = "n01/a b.jpg", .offset = 512, .size = 100, .label = 3},
                               {.member = "n02/c.png", .offset = 2048, .size = 4000, .label = 0}}};
  const std::string text = format_shard_index(index);
  EXPECT_EQ(text,
            "gpufeed-shard-index 2\nshard_size 10240\nsha256 " + sha +
                "\netag \"abc-1\"\nsamples 2\n512 100 3 n01/a b.jpg\n2048 4000 0 n02/c.png\n");
  const ShardIndex back = parse_shard_index(text, "x");
  EXPECT_EQ(back.shard_size, 10240);
  EXPECT_EQ(back.sha256, sha);
  EXPECT_EQ(back.etag, "\"abc-1\"");
  ASSERT_EQ(back.samples.size(), 2u);
  EXPECT_EQ(back.samples[0].member, "n01/a b.jpg");
  EXPECT_EQ(back.samples[1].offset, 2048);
  EXPECT_EQ(back.samples[1].size, 4000);
  EXPECT_EQ(back.samples[0].label, 3);
  index.etag.clear();
  EXPECT_EQ(parse_shard_index(format_shard_index(index), "x").samples.size(), 2u);
  // Version 1 (no digest) is still read: its index proves nothing about its shard (sha256 empty).
  const ShardIndex v1 = parse_shard_index("gpufeed-shard-index 1\nshard_size 100\nsamples 1\n0 10 1 a.jpg\n", "x");
  EXPECT_EQ(v1.sha256, "");
  EXPECT_EQ(v1.samples.size(), 1u);

  const auto refused = [](const std::string& bad, const std::string& why) {
    try {
      parse_shard_index(bad, "shards/t.tar.gpufeed-idx");
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const ShardError& e) {
      EXPECT_NE(std::string(e.what()).find("shards/t.tar.gpufeed-idx"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused("gpufeed-shard-index 3\n", "version 1 or 2");
  refused("GPUFIDX\n", "version 1 or 2");
  refused("gpufeed-shard-index 2\nshard_size 100\nsha256 abc\nsamples 0\n", "not 64 lower-case hex digits");
  refused("gpufeed-shard-index 1\nshard_size x\n", "shard_size 'x'");
  refused("gpufeed-shard-index 1\nshard_size 100\nsamples 2\n0 10 1 a.jpg\n", "ends after 1 of its 2");
  refused("gpufeed-shard-index 1\nshard_size 100\nsamples 1\n90 20 1 a.jpg\n", "runs past the shard's 100 bytes");
  refused("gpufeed-shard-index 1\nshard_size 100\nsamples 1\n0 10 16777216 a.jpg\n", "label 16777216");
  refused("gpufeed-shard-index 1\nshard_size 100\nsamples 1\n0 10 1\n", "expected '<offset>");
  refused("gpufeed-shard-index 1\nshard_size 100\nsamples 1\n0 10 1 a.jpg\n0 10 1 b.jpg\n", "more lines");
  ShardIndex newline;
  newline.shard_size = 1;
  newline.samples.push_back({.member = "a\nb.jpg"});
  EXPECT_THROW(format_shard_index(newline), std::invalid_argument);
}

TEST(ShardTrailerFormat, RoundTripsAndRefusesWhatIsNotOne) {
  const std::string sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  const std::string t = format_shard_trailer({.sha256 = sha, .tar_bytes = 3072});
  ASSERT_EQ(static_cast<int64_t>(t.size()), kShardTrailerBytes);
  EXPECT_EQ(t.substr(0, t.find('\0')), "gpufeed-shard-trailer 1\nsha256 " + sha + "\ntar_bytes 3072\n");
  const auto back = parse_shard_trailer(t, 3072 + kShardTrailerBytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->sha256, sha);
  EXPECT_EQ(back->tar_bytes, 3072);
  // The file's last bytes: more before the trailer are fine.
  EXPECT_TRUE(parse_shard_trailer(std::string(100, 'x') + t, 3072 + kShardTrailerBytes));
  EXPECT_FALSE(parse_shard_trailer(t, 4000));                      // a file of another size (cut, appended to)
  EXPECT_FALSE(parse_shard_trailer(t.substr(1), 3072 + 511));      // short
  EXPECT_FALSE(parse_shard_trailer(std::string(512, '\0'), 3584)); // end-of-archive zeros: no trailer
  std::string flipped = t;
  flipped[40] = 'G';  // not hex
  EXPECT_FALSE(parse_shard_trailer(flipped, 3072 + kShardTrailerBytes));
  std::string tail_garbage = t;
  tail_garbage[511] = 'x';
  EXPECT_FALSE(parse_shard_trailer(tail_garbage, 3072 + kShardTrailerBytes));
  EXPECT_THROW(format_shard_trailer({.sha256 = "abc", .tar_bytes = 1}), std::invalid_argument);
}
